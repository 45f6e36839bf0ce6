"""Two real vLLM servers: the rollout service spreads work over both, keeps generating
when one is stopped, sends work to it again once it is back, and tags samples with
the policy version that vLLM's per-token weight_versions spans report.

The second server is private to this module (~30 s and ~2 GB to start), so it may
be stopped and relabelled freely; the shared session server is never touched.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from agrpo.v1 import common_pb2
from rollout_helpers import make_cfg, running_rollout, wait_for, write_dataset
from vllm_server import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]
G = 4


class SecondServer(VLLMServer):
    """Binds its engine to core 1: every vLLM CPU worker binds core 0 by default, and two
    busy workers on one core starve each other (a restarted engine then stalls)."""

    def env(self) -> dict[str, str]:
        return {**super().env(), "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("AGRPO_SECOND_VLLM_CORES", "1")}


@pytest.fixture(scope="module")
def second_server(tiny_model_dir):
    holder = {"server": SecondServer(tiny_model_dir).start()}
    try:
        yield holder
    finally:
        holder["server"].stop()


def _state(app, url):
    return next(s for s in app.balancer.servers if s.client.base_url == url)


async def test_generation_survives_a_stopped_server_and_uses_it_again(
        vllm_server, second_server, tiny_model_dir, tmp_path, reward_port, trainer):
    srv2 = second_server["server"]
    cfg = make_cfg(vllm_urls=[vllm_server.base_url, srv2.base_url], model_dir=tiny_model_dir,
                   dataset_file=write_dataset(tmp_path / "d.jsonl", 40), trainer_port=trainer.port,
                   reward_port=reward_port, num_generations=G, max_steps=10_000,  # unbounded epochs
                   rollout={"generate_endpoint": "completions"})
    async with running_rollout(cfg) as svc:
        app = svc.app
        one, two = _state(app, vllm_server.base_url), _state(app, srv2.base_url)
        await wait_for(lambda: one.completed >= 8 and two.completed >= 8, what="both servers used")

        await asyncio.to_thread(srv2.stop)
        await wait_for(lambda: not two.up, what="stopped server marked down")
        base_one, base_trained = one.completed, len(trainer.trained)
        await wait_for(lambda: one.completed >= base_one + 40 and len(trainer.trained) >= base_trained + 40,
                       what="generation going on with one server")
        assert not two.up

        # Pause the consumer while the server restarts: on 2 cores a busy rollout starves its start-up.
        trainer.stop_reading()
        restarted = SecondServer(tiny_model_dir, port=srv2.port, startup_timeout=480)
        second_server["server"] = restarted
        await asyncio.to_thread(restarted.start)
        trainer.resume_reading()
        await wait_for(lambda: two.up, timeout=60, what="restarted server marked up")
        base_two = two.completed
        await wait_for(lambda: two.completed >= base_two + 8, what="work sent to the restarted server")

        trainer.finish()
        await wait_for(lambda: app.finished.is_set(), what="rollout done after the trainer said done")
        assert app.identity.state == common_pb2.SERVING_STATE_DONE
    counts = {}
    for s in trainer.trained:
        key = (s.prompt_key.dataset_index, s.prompt_key.epoch, s.group_id)
        counts[key] = counts.get(key, 0) + 1
    # Groups arrive whole; only the one being sent when the trainer said done may be cut.
    assert all(n <= G for n in counts.values())
    assert sum(n != G for n in counts.values()) <= 1, counts
    per_key = {}
    for (i, e, _gid) in counts:
        per_key[(i, e)] = per_key.get((i, e), 0) + 1
    assert all(n == 1 for n in per_key.values())  # no prompt key trained twice


async def test_samples_carry_the_version_vllm_reports(second_server, tiny_model_dir, dataset_file,
                                                      reward_port, trainer):
    srv = second_server["server"]
    srv.post_json("/update_weight_version", {"new_version": "3"})
    trainer.publish(3)
    cfg = make_cfg(vllm_urls=[srv.base_url], model_dir=tiny_model_dir, dataset_file=dataset_file,
                   trainer_port=trainer.port, reward_port=reward_port, num_generations=G)
    async with running_rollout(cfg):
        await wait_for(lambda: len(trainer.trained) >= 8, what="samples trained")
    for s in trainer.trained:
        assert s.policy_version == 3
        assert [(v.policy_version, v.start, v.end) for v in s.version_spans] == [
            (3, s.prompt_length, len(s.input_ids))]
