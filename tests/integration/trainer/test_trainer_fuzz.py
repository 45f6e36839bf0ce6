"""Fuzz the trainer's PushSamples and the status/heartbeat RPCs of trainer and rollout.

About 1,000 cases from tests/support/fuzz_samples.py (benchmarks/fuzz_rpcs.py runs 10,000+)
against a real trainer (real socket, the session's vLLM server, the tiny model) and the
rollout's gRPC server (fuzz_driver.start_rollout_rpcs: RolloutService over a RolloutApp that
is not set up, so its status is empty). The server must stay up and keep training, answer
every case as fuzz_samples says (REJECTED naming the problem, DROPPED_STALE for versions
never published, INVALID_ARGUMENT for bytes that do not parse, RESOURCE_EXHAUSTED over the
size limit), never hang, and train only valid samples: the audit log and the ledger hold
every valid sample and no other, and the weights stay finite.
"""

from __future__ import annotations

import grpc
import pytest

from agrpo.v1 import common_pb2
from agrpo.v1 import rollout_service_pb2_grpc as rollout_grpc
from agrpo.v1 import trainer_service_pb2_grpc as trainer_grpc
from fuzz_driver import fuzz, fuzz_targets, serving, trained_problems
from fuzz_samples import KINDS
from trainer_helpers import make_cfg

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]
NUM_CASES = 1000


def fuzz_cfgs(model_dir, output_dir, urls):
    """Trainer and rollout configs: training never ends by itself; 1 MiB messages, so the
    oversized frames stay cheap."""
    trainer = make_cfg(model_dir, output_dir, urls, max_steps=100_000, queue_maxsize=64,
                       trainer={"max_message_mb": 1})
    rollout = make_cfg(model_dir, output_dir / "rollout", [],
                       rollout={"port": 0, "metrics_port": None, "max_message_mb": 1})
    return trainer, rollout


async def test_fuzzed_rpcs_reject_bad_input_and_train_only_valid_samples(shared_vllm, tiny_model_dir, tmp_path):
    trainer_cfg, rollout_cfg = fuzz_cfgs(tiny_model_dir, tmp_path, [shared_vllm.base_url])
    async with fuzz_targets(trainer_cfg, rollout_cfg) as (svc, rollout, make_cases):
        cases = make_cases(seed=15, max_message_bytes=1 << 20)
        report = await fuzz(svc.port, rollout.port, cases, NUM_CASES)
        print(f"\n{NUM_CASES} cases in {report.seconds:.1f} s\n{report.format_table()}")
        assert not report.failures, "\n".join(report.failures[:30])
        assert len(report.table()) == len(KINDS)  # every kind was drawn

        # Still up and still training: health, status, heartbeat, and one more valid sample.
        assert await serving(svc.port, "agrpo.v1.TrainerService")
        assert await serving(rollout.port, "agrpo.v1.RolloutService")
        assert svc.failed is None and not svc._run_task.done()
        last = make_cases(seed=16, weights={k: float(k == "valid") for k in KINDS})
        final = await fuzz(svc.port, rollout.port, last, 1)
        assert not final.failures and final.got == {0: "TRAINED"}, final.failures
        async with grpc.aio.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
            status = (await trainer_grpc.TrainerServiceStub(ch).GetStatus(common_pb2.GetStatusRequest(),
                                                                            timeout=10)).trainer
        async with grpc.aio.insecure_channel(f"127.0.0.1:{rollout.port}") as ch:
            beat = await rollout_grpc.RolloutServiceStub(ch).Heartbeat(common_pb2.HeartbeatRequest(), timeout=10)
        assert beat.receiver.service == "rollout"
        assert status.samples_dropped["rejected"] >= NUM_CASES // 3

        # Nothing but valid samples trained (audit log, ledger), and the weights are finite.
        assert trained_problems([report, final], svc.app, tmp_path) == []
