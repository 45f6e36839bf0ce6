"""Fuzz the trainer's PushSamples and the status/heartbeat RPCs (trainer and rollout) at length.

    .venv/bin/python benchmarks/fuzz_rpcs.py [--cases 10000] [--seed 15] [--concurrency 8] [--vllm-url URL]

The long version of tests/integration/trainer/test_trainer_fuzz.py (about 1,000 cases in CI):
a real trainer on the tiny model over a real socket, a CPU vLLM server (started here unless
--vllm-url names one) and the rollout's gRPC server; cases from tests/support/fuzz_samples.py
(valid samples mixed with every malformed kind), sent by tests/support/fuzz_driver.py. Prints
case kind -> count -> outcomes (the ack, else the status code) and the total time, then checks
that the trainer is still SERVING and training, and trained exactly the valid samples (audit
log, ledger, finite weights). Exits 1 when any case got what it must not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "support")]


async def run(args, url: str, model_dir: str, out: Path) -> int:
    from fuzz_driver import fuzz, fuzz_targets, serving, trained_problems
    from fuzz_samples import KINDS
    from trainer_helpers import make_cfg

    mb = args.max_message_mb
    trainer_cfg = make_cfg(model_dir, out, [url], max_steps=10**9, queue_maxsize=64,
                           trainer={"max_message_mb": mb}, log_level="warning")
    rollout_cfg = make_cfg(model_dir, out / "rollout", [], rollout={"port": 0, "metrics_port": None,
                                                                   "max_message_mb": mb})
    async with fuzz_targets(trainer_cfg, rollout_cfg) as (svc, rollout, make_cases):
        cases = make_cases(seed=args.seed, max_message_bytes=mb << 20)
        report = await fuzz(svc.port, rollout.port, cases, args.cases, concurrency=args.concurrency)
        final = await fuzz(svc.port, rollout.port, make_cases(
            seed=args.seed + 1, weights={k: float(k == "valid") for k in KINDS}), 1)
        checks = {
            "trainer SERVING": await serving(svc.port, "agrpo.v1.TrainerService"),
            "rollout SERVING": await serving(rollout.port, "agrpo.v1.RolloutService"),
            "training loop alive": svc.failed is None and not svc._run_task.done(),
            "a last valid sample trains": final.got == {0: "TRAINED"},
        }
        problems = trained_problems([report, final], svc.app, out)
        status = svc.app.status()
    print(f"\n{args.cases} cases (seed {args.seed}, concurrency {args.concurrency}) in {report.seconds:.1f} s "
          f"({args.cases / report.seconds:.0f} cases/s); trainer at step {status['step']}, "
          f"{status['samples_trained']} samples trained, {status['samples_received']} received\n")
    print(report.format_table())
    print()
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(f"{'ok  ' if not problems else 'FAIL'} trained exactly the valid samples" + "".join(
        f"\n     {p}" for p in problems))
    print(f"{'ok  ' if not report.failures else 'FAIL'} every case got what it should"
          + f" ({len(report.failures)} did not)" * bool(report.failures))
    for line in report.failures[:40]:
        print(f"     {line[:300]}")
    return int(bool(report.failures or problems or not all(checks.values())))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=15)
    p.add_argument("--concurrency", type=int, default=8, help="fresh streams and unary calls in flight")
    p.add_argument("--max-message-mb", type=int, default=1, help="the services' message limit")
    p.add_argument("--vllm-url", default=None, help="a running vLLM server of the tiny model (else one is started)")
    args = p.parse_args()
    from agrpo.demo.tiny_model import make_tiny_model
    from agrpo.launcher.vllm_process import VLLMServer
    from agrpo.services.common.logging import setup_logging

    setup_logging("bench", "text", "warning")
    model_dir = str(make_tiny_model(ROOT / ".cache" / "tiny-model" / "seed0", seed=0))
    server, url = None, args.vllm_url
    started = time.monotonic()
    if url is None:
        server = VLLMServer(model_dir).start()
        url = server.base_url
    try:
        with tempfile.TemporaryDirectory(prefix="agrpo-fuzz-") as out:
            code = asyncio.run(run(args, url, model_dir, Path(out)))
    finally:
        if server is not None:
            server.stop()
    print(f"total {time.monotonic() - started:.1f} s (vLLM start-up and trainer boot included)")
    return code


if __name__ == "__main__":
    sys.exit(main())
