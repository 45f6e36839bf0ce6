"""The trainer's Engine under FSDP2 (2 CPU ranks, gloo) trains exactly like one process.

fsdp_engine_worker.py runs 3 steps (3 micro-batches of 2 uneven rows each; tree,
tree, unpacked; clipping active) single-process on rank 0, then under FSDP2 with
each rank training its own row, and reports both. Differences left are fp32
reduction order (accumulation order of the row gradients, the sharded grad norm).
Run for the tiny model as built (untied head); marked slow: with tied embeddings (the
Qwen2.5 0.5B/1.5B layout, where lm_head.weight is the embedding) and a tiny Qwen2-MoE
(router aux loss on, packed expert weights).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def variant(kind: str, src: Path, dst: Path) -> Path:
    """A random model beside the tiny one's tokenizer: tied Qwen2 or a Qwen2-MoE."""
    import shutil

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        if kind == "tied":
            cfg = Qwen2Config.from_pretrained(src)
            cfg.tie_word_embeddings = True
            model = Qwen2ForCausalLM(cfg)
            with torch.no_grad():
                for p in model.parameters():
                    if p.dim() == 2:
                        p.normal_(0.0, 0.2)
            assert model.lm_head.weight is model.model.embed_tokens.weight
        else:
            cfg = Qwen2MoeConfig(vocab_size=1024, hidden_size=64, intermediate_size=64,
                                 moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 num_key_value_heads=1, num_experts=4, num_experts_per_tok=2,
                                 shared_expert_intermediate_size=32, router_aux_loss_coef=0.01,
                                 tie_word_embeddings=False)
            model = Qwen2MoeForCausalLM(cfg)
    model.save_pretrained(dst)
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.suffix == ".jinja":
            shutil.copy(f, dst / f.name)
    return dst


@pytest.fixture(scope="module", params=["untied", pytest.param("tied", marks=pytest.mark.slow),
                                        pytest.param("moe", marks=pytest.mark.slow)])
def result(request, tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fsdp")
    src = Path(tiny_model_dir)
    model = src if request.param == "untied" else variant(request.param, src, folder / request.param)
    out = folder / "out.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(HERE / "fsdp_engine_worker.py"), str(model), str(out)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return dict(json.loads(out.read_text()), kind=request.param)


@pytest.mark.timeout(360)
def test_fsdp_steps_match_single_process(result):
    assert result["world"] == 2 and all(n >= 2 for n in result["micro_batches"])  # grad accumulation
    assert any(a != b for a, b in result["rows_terms"])  # ranks hold different term counts
    assert result["single"][0]["grad_norm"] > 0.5  # clipping (max_grad_norm 0.5) is active
    for one, sharded in zip(result["single"], result["fsdp"], strict=True):
        for key, value in one.items():
            assert sharded[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert result["fsdp_eval"] == pytest.approx(result["single_eval"], rel=1e-5, abs=1e-7)
    if result["kind"] == "moe":  # the router's load-balancing loss is part of the step
        assert result["single"][0]["aux_loss"] > 0


@pytest.mark.timeout(360)
def test_gathered_weights_equal_single_process(result):
    assert result["names_match"]
    assert result["update_norm"] > 0.1  # the steps really moved the weights
    assert result["rel_diff_vs_update"] < 1e-4, result["rel_diff_vs_update"]
    assert result["max_abs_diff"] < 1e-4
    assert result["bf16_identical"] > 0.999 and result["bf16_dtype"]


@pytest.mark.timeout(360)
def test_unit_gather_equals_per_parameter_gather(result):
    assert result["units_equal_per_param"]
    assert result["weights_for_sync_ok"] and result["single_weights_for_sync_ok"]
    assert result["dst_elsewhere_empty"]
    mp = result["mixed_precision"]
    assert math.isfinite(mp["loss"])
    assert mp["loss"] == pytest.approx(result["single"][0]["loss"], rel=0.25)  # bf16 forward, same step
    for key in ("bfloat16", "float32"):
        assert mp[f"{key}_equal_per_param"] and mp[f"{key}_dtype_ok"], key
