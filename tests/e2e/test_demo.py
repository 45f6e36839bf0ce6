"""End to end: a shortened `agrpo demo` as separate processes (reward, trainer, rollout over
gRPC), as a user gets it on this CPU machine (the trainer generates itself, sync schedule) and
with real vLLM generating (the async schedule), and with a LoRA adapter training while vLLM
generates, on one trainer process and sharded over two (FSDP2 on gloo).
Asserts learning, staleness and exactly-once
accounting from the run's own outputs (metrics JSONL and the trainer's trained-sample log)."""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.slow]

NUM_PROMPTS, EPOCHS, MAX_STALENESS = 48, 2, 2


LORA = ["--set", "peft.r=16", "--set", "peft.lora_alpha=32", "--set", "peft.target_modules=all-linear",
        "--learning-rate", "2e-2"]
EXTRA = {"default": ["--learning-rate", "5e-3"], "vllm": ["--learning-rate", "5e-3"], "lora": LORA,
         "lora-ranks": [*LORA, "--set", "trainer.num_processes=2"]}


@pytest.fixture(scope="module", params=sorted(EXTRA))
def demo_run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    generation = [] if request.param == "default" else ["--set", "launcher.generation=vllm"]
    extra = EXTRA[request.param]
    # A finished earlier run in the same folder: the demo must start over, not resume from it.
    old = out / "trainer_output" / "checkpoint-999"
    old.mkdir(parents=True)
    (old / "agrpo_state.json").write_text('{"step": 999}')  # "complete" to the trainer
    proc = subprocess.run(
        [sys.executable, "-m", "agrpo.cli", "demo", "--epochs", str(EPOCHS),
         "--num-prompts", str(NUM_PROMPTS), "--out", str(out), "--timeout", "900", *generation, *extra],
        capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["generation"] == ("trainer" if request.param == "default" else "vllm"), summary
    return out, proc.stdout


def test_lora_syncs_the_adapter_alone_and_checkpoints_it(demo_run, tiny_model_dir):
    """With peft set, the demo's vLLM takes adapters at run time and receives the adapter alone
    (not the model, nor the adapted layers merged: those are 0.53 of this model), and the
    checkpoints hold the adapter in peft's format."""
    out, _ = demo_run
    if json.loads((out / "summary.json").read_text())["generation"] == "trainer":
        pytest.skip("the trainer generates itself: no weights travel")
    checkpoints = sorted((out / "trainer_output").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    lora = (checkpoints[-1] / "adapter_config.json").exists()
    sizes = [m["perf/weight_sync_mb"] for m in map(json.loads, (out / "metrics.jsonl").open())
             if "perf/weight_sync_mb" in m]
    full_mb = sum(f.stat().st_size for f in tiny_model_dir.glob("*.safetensors")) / 2**20
    assert sizes, "no weight sync was logged"
    if lora:
        assert not (checkpoints[-1] / "model.safetensors").exists()
        assert max(sizes) < 0.25 * full_mb, (max(sizes), full_mb)
    else:
        assert min(sizes) > 0.9 * full_mb, (min(sizes), full_mb)
    shards = checkpoints[-1] / "shards"
    if lora and shards.is_dir():  # two ranks: each wrote its shards of what trains, not of the frozen base
        from torch.distributed.checkpoint import FileSystemReader

        assert "rank 1 of 2 joined" in (out / "trainer_output" / "logs" / "trainer.log").read_text()
        saved = [k for k in FileSystemReader(str(shards)).read_metadata().state_dict_metadata if k.startswith("model.")]
        assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved), saved[:5]


def test_demo_reward_rises(demo_run):
    out, stdout = demo_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] >= 20, summary
    assert summary["reward_last10"] > summary["reward_first10"] + 0.05, summary
    assert (out / "curves.png").stat().st_size > 10_000
    assert "reward first 10 steps" in stdout


def test_no_trained_sample_exceeded_max_staleness(demo_run):
    out, _ = demo_run
    trained = [json.loads(line) for line in (out / "trainer_output" / "trained_samples.jsonl").open()]
    assert trained
    assert max(r["staleness"] for r in trained) <= MAX_STALENESS
    assert all(r["trainer_version"] - r["policy_version"] == r["staleness"] for r in trained)


def test_every_prompt_trained_once_per_epoch(demo_run):
    out, _ = demo_run
    trained = [json.loads(line) for line in (out / "trainer_output" / "trained_samples.jsonl").open()]
    groups = collections.defaultdict(set)
    for r in trained:
        groups[tuple(r["prompt_key"])].add(r["group_id"])
    expected = {(i, e) for i in range(NUM_PROMPTS) for e in range(EPOCHS)}
    assert set(groups) == expected
    assert all(len(g) == 1 for g in groups.values()), {k: g for k, g in groups.items() if len(g) > 1}
    ids = [r["sample_id"] for r in trained]
    assert len(ids) == len(set(ids))


def test_pacing_keeps_stale_drops_under_two_percent(demo_run):
    """Generation is held to max_staleness ahead of training, so almost nothing generated is thrown
    away: counts from the services' own status (samples generated, stale drops at both ends),
    with full weights and with adapter-only LoRA sync alike."""
    out, _ = demo_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples_generated"] >= 0.9 * summary["samples_trained"] > 0, summary
    assert summary["dropped_stale_share"] <= 0.02, summary


def test_with_vllm_generating_every_step_trains_the_batch_asked_for_and_nothing_goes_stale(tmp_path):
    """A step is per_device_train_batch_size x gradient_accumulation_steps x ranks samples whatever
    the token budget holds, and pacing sizes generation by that same number: with vLLM generating
    128-token completions and 32 samples a step, every step trains 32 and at most 2% of what vLLM
    generated is dropped as stale (before: 8 a step and 53% stale)."""
    steps = 6
    proc = subprocess.run(
        [sys.executable, "-m", "agrpo.cli", "demo", "--steps", str(steps), "--out", str(tmp_path), "--timeout", "900",
         "--set", "per_device_train_batch_size=32", "--set", "max_completion_length=128",
         "--set", "launcher.generation=vllm"],
        capture_output=True, text=True, timeout=1200, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    sizes = [r["batch/num_samples"] for r in rows if "batch/num_samples" in r]
    assert sizes == [32] * steps, sizes
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["generation"] == "vllm", summary
    assert summary["samples_trained"] == 32 * steps, summary
    assert summary["dropped_stale_share"] <= 0.02, summary
