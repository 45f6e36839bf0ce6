"""End to end under kill -9: `benchmarks/chaos.py --short` kills the trainer (once mid weight
sync, once mid checkpoint, once anywhere), rollout, reward and vLLM of a running job, then
audits the raw trained-sample log. Nothing may be lost, trained twice or past max_staleness,
every group is trained whole, and training must resume after every kill: under agrpo run's
supervisor, and under a plain one that starts the same command line again with a config that
has no run_id (the trainer continues its run instead of starting over)."""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("supervisor", ["launcher", "plain"])
def test_six_kills_lose_nothing_and_train_nothing_twice(tmp_path, supervisor):
    out = tmp_path / "chaos"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--short", "--out", str(out),
                           "--supervisor", supervisor], capture_output=True, text=True, timeout=1400, cwd=ROOT,
                           check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    report = json.loads((out / "chaos.json").read_text())
    assert report["ok"] and report["audit"].startswith("exactly once: OK"), report["audit"]
    kills = report["kills"]
    rows = "\n".join(json.dumps(k) for k in kills)  # in full: pytest shortens a list's repr
    assert sorted(k["target"] for k in kills) == sorted(
        ["trainer", "rollout", "reward", "vllm", "trainer@sync", "trainer@save"])
    assert all(k["killed"] and k["next_step_s"] is not None for k in kills), rows
    assert all(k["at_moment"] for k in kills if "@" in k["target"]), rows  # mid sync, mid save
    # The raw log itself (not a reconstruction): every sample id once, no step past the bound.
    records = [json.loads(line) for line in
               (out / "trainer_output" / "trained_samples.jsonl").read_text().splitlines()]
    twice = [sid for sid, n in collections.Counter(r["sample_id"] for r in records).items() if n > 1]
    assert not twice, twice[:5]
    assert max(r["staleness"] for r in records) <= 2 and min(r["staleness"] for r in records) >= 0
    assert max(r["step"] for r in records) > max(k["step"] for k in kills)  # trained after the last kill
    groups = collections.Counter(r["group_id"] for r in records)
    assert all(groups[r["group_id"]] == r["group_size"] == 8 for r in records)  # every group trained whole
    if supervisor == "plain":  # each trainer restart continued the run from a checkpoint, not step 0
        log = (out / "logs" / "trainer.log").read_text()
        continued = re.findall(r"continuing run \S+ from (\S+): step (\d+)", log)
        assert len(continued) == sum(k["target"].startswith("trainer") for k in kills), log[-3000:]
        # From its latest checkpoint: the last kill before a save resumes from scratch.
        saves = [k["step"] for k in kills if k["target"].startswith("trainer")]
        assert all(int(step) >= 5 * (at // 5) - 5 for (_, step), at in zip(continued, saves)), (continued, saves)
        assert not (out / "trainer_output" / "previous").exists()
