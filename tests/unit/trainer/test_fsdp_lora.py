"""A LoRA model under FSDP2 (2 CPU ranks, gloo) trains, syncs and checkpoints like one process.

fsdp_lora_worker.py trains 3 steps single-process and sharded from the same start, gathers
the adapter and the merged weights, writes the shards a multi-rank checkpoint holds, restores
them into a fresh sharded engine and steps both once more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def result(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fsdp_lora")
    out = folder / "out.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(HERE / "fsdp_lora_worker.py"), str(tiny_model_dir), str(folder / "shards"), str(out)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(360)
def test_sharded_lora_steps_match_single_process(result):
    assert result["world"] == 2 and len(result["single"]) == 3
    assert result["single"][1]["grad_norm"] > 0  # the adapter trains (B moved off 0 at step 1)
    for one, sharded in zip(result["single"], result["fsdp"], strict=True):
        for key, value in one.items():
            assert sharded[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


@pytest.mark.timeout(360)
def test_gathered_adapter_and_merged_weights_equal_single_process(result):
    adapter, merged = result["adapter"], result["merged"]
    assert adapter["names"] == adapter["want_names"] and adapter["names"]
    assert all(n.startswith("base_model.model.") and (".lora_A." in n or ".lora_B." in n) for n in adapter["names"])
    assert adapter["norm"] > 0 and adapter["max_abs_diff"] < 5e-5  # fp32 sums in another order
    assert merged["names"] == merged["want_names"]
    assert not any("lora_" in n or "base_layer" in n for n in merged["names"])  # base-model names only
    assert merged["max_abs_diff"] < 1e-5
    assert result["elsewhere_empty"]


@pytest.mark.timeout(360)
def test_a_checkpoint_holds_the_adapter_and_its_optimizer_and_resumes_exactly(result):
    assert result["saved_is_adapter"]["max_abs_diff"] < 5e-5  # the checkpoint's peft files
    model_tensors = [k for k in result["shard_tensors"] if k.startswith("model.")]
    assert model_tensors and all("lora_" in k for k in model_tensors)  # the frozen base is not copied
    assert any(k.startswith("optim.") for k in result["shard_tensors"])
    assert result["restored"] == result["continued"]  # same weights and optimizer state: same next step
