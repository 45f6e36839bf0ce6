"""A trainer restarted inside its run (same run_id): it resumes its last checkpoint by itself,
publishes above every version it ever published (never reusing a number for other weights),
refuses samples of the rolled-back weights, and rewinds the audit log to the checkpoint."""

from __future__ import annotations

import json

import pytest

from agrpo.services.trainer.sample import Outcome
from agrpo.services.trainer.server import build
from trainer_helpers import Producer, make_cfg, rollout_samples

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


def _audit(out) -> list[dict]:
    return [json.loads(line) for line in (out / "trained_samples.jsonl").read_text().splitlines()]


async def test_restart_resumes_above_every_published_version(shared_vllm, tiny_model_dir, tmp_path):
    cfg = dict(run_id="run-A", save_strategy="steps", save_steps=2, max_steps=10, max_staleness=2)
    first = await build(make_cfg(tiny_model_dir, tmp_path, [shared_vllm.base_url], **cfg))
    await first.start()
    try:
        producer = Producer(first.port, prompts_per_epoch=100)
        for step in range(3):  # three steps: a checkpoint after step 2, then version 4 is published
            samples = rollout_samples(1, 4, version=first.app.state.version, seed=step, start_index=step)
            await producer.send(samples)
            await producer.wait_for(lambda n=step + 1: first.app.state.step == n and first.app.state.version == n + 1)
        await producer.close()
    finally:
        first._run_task.cancel()  # a crash after step 3: the loop ends without its stop checkpoint
        await first.stop()
    assert [p.name for p in sorted(tmp_path.glob("checkpoint-*"))] == ["checkpoint-2"]
    assert max(r["step"] for r in _audit(tmp_path)) == 3

    again = await build(make_cfg(tiny_model_dir, tmp_path, [shared_vllm.base_url], **cfg))
    await again.start()
    try:
        st = again.app.state
        assert (st.step, st.version) == (2, 5)  # checkpoint-2 held version 3; 4 was published after it
        assert st.lineage.segments == ((0, 3, 0), (5, None, 3))
        assert max(r["step"] for r in _audit(tmp_path)) == 2  # step 3 rolled back ...
        moved = (tmp_path / "trained_samples.rolled_back.jsonl").read_text().splitlines()
        assert {json.loads(line)["step"] for line in moved} == {3}  # ... and kept aside
        producer = Producer(again.port, producer_id="producer-2")
        rolled_back = rollout_samples(1, 4, version=4, seed=7, start_index=7, prefix="gone")
        newer = rollout_samples(1, 4, version=6, seed=8, start_index=8, prefix="future")
        on_lineage = rollout_samples(1, 4, version=3, seed=9, start_index=9, prefix="kept")
        await producer.send(rolled_back + newer + on_lineage)
        await producer.wait_for(lambda: all(producer.final(s.sample_id) is not None
                                            for s in rolled_back + newer)
                                and all(producer.final(s.sample_id) == Outcome.TRAINED for s in on_lineage))
        assert all(producer.final(s.sample_id) == Outcome.DROPPED_STALE for s in rolled_back + newer)
        assert "lineage" in producer.reasons[rolled_back[0].sample_id]
        assert "newer" in producer.reasons[newer[0].sample_id]
        await producer.close()
    finally:
        await again.stop()
    trained = _audit(tmp_path)
    kept = [r for r in trained if r["sample_id"].startswith("kept")]
    assert kept and all(r["staleness"] == 0 and r["trainer_version"] == 5 for r in kept)  # real distance
    steps = [r["step"] for r in trained]
    assert steps == sorted(steps) and len({r["sample_id"] for r in trained}) == len(trained)
