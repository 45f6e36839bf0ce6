"""CPU weight-sync time per phase into a real vLLM server (cpu_http plugin), per transport.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/trainer_sync.py [--rounds 5] [--url http://...]

Without --url it starts its own vLLM server (tests/vllm_server.py) on the tiny model.
Prints the median seconds of each phase over the rounds for the http and shared_path
transports.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

PHASES = ("prepare", "pause", "start", "update", "finish", "resume", "total")


async def bench(url: str, model_dir: str, rounds: int) -> list[dict]:
    from transformers import AutoModelForCausalLM

    from agrpo.services.trainer.weight_sync import WeightSyncer
    from agrpo.services.trainer.weight_sync.transports import HttpTransport, SharedPathTransport, named_weights

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="float32")
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    rows = []
    for transport in (HttpTransport(), SharedPathTransport(Path(tempfile.mkdtemp(prefix="agrpo-sync-")))):
        syncer = WeightSyncer([url], transport, 60.0, 600.0)
        await syncer.open()
        samples: dict[str, list[float]] = {p: [] for p in PHASES}
        for r in range(rounds):
            version = 1000 + r
            report = await syncer.sync(version, lambda v=version, t=transport: t.prepare(named_weights(model), v))
            assert report.ok, report.errors
            for p in PHASES:
                samples[p].append(report.phase_s.get(p, 0.0))
        # Put the server back on its initial label.
        await syncer.admin(url).call("restore", "POST", "/update_weight_version", {"new_version": "default"})
        await syncer.close()
        rows.append({"transport": transport.name, "MB": nbytes / 1e6,
                     **{p: statistics.median(v) for p, v in samples.items()}})
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--url", default=None)
    args = p.parse_args()
    from agrpo.demo.tiny_model import make_tiny_model

    model_dir = str(make_tiny_model(ROOT / ".cache/tiny-model/seed0", seed=0))
    server = None
    url = args.url
    if url is None:
        from vllm_server import VLLMServer

        server = VLLMServer(model_dir).start()
        url = server.base_url
    try:
        rows = asyncio.run(bench(url, model_dir, args.rounds))
    finally:
        if server is not None:
            server.stop()
    cols = ["transport", "MB", *PHASES]
    print("median seconds per phase over", args.rounds, "rounds")
    print(" | ".join(f"{c:>11}" for c in cols))
    for r in rows:
        print(" | ".join(f"{r[c]:>11.4f}" if isinstance(r[c], float) else f"{r[c]:>11}" for c in cols))


if __name__ == "__main__":
    main()
