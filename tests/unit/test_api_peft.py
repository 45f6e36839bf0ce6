"""peft_config=LoraConfig(...) as in TRL: it becomes the job's `peft:` section, or a one-line error."""

from __future__ import annotations

import pytest
import yaml

from agrpo import AsyncGRPOConfig, AsyncGRPOTrainer
from agrpo.api.peft_config import peft_section
from agrpo.services.common.config import AgrpoConfig


def test_a_lora_config_becomes_the_peft_section(tmp_path):
    from peft import LoraConfig

    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "v_proj"],
                      task_type="CAUSAL_LM")
    trainer = AsyncGRPOTrainer(model=str(tmp_path), reward_funcs="accuracy", train_dataset="x.jsonl",
                               args=AsyncGRPOConfig(output_dir=str(tmp_path / "out")), peft_config=lora)
    written = yaml.safe_load(trainer.config().read_text())["peft"]
    assert written["r"] == 16 and written["lora_alpha"] == 32 and written["lora_dropout"] == 0.05
    assert sorted(written["target_modules"]) == ["q_proj", "v_proj"] and written["task_type"] == "CAUSAL_LM"
    assert AgrpoConfig(peft=written).peft is not None  # the services accept what the API writes


def test_what_agrpo_would_ignore_is_refused():
    from peft import LoraConfig, PromptTuningConfig

    with pytest.raises(TypeError, match="use_dora not supported"):
        peft_section(LoraConfig(use_dora=True))
    with pytest.raises(TypeError, match="only LoRA"):
        peft_section(PromptTuningConfig(num_virtual_tokens=4, task_type="CAUSAL_LM"))
    assert peft_section({"r": 4}) == {"r": 4}
