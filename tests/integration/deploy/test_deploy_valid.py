"""The deployment files validate offline, and the validator rejects broken ones.

Runs scripts/validate_deploy.sh (compose config, kustomize + kubernetes-validate
--strict, promtool, Dockerfile rules, per-container config check, metrics docs and
dashboard drift) on the real deploy/ tree, then on copies with one deliberate defect
each, which must fail with the check that catches it named in the output.
The first run installs the validators into .cache/tools (about 15 s, needs PyPI and,
for promtool, apt as root); later runs take a few seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "validate_deploy.sh"

pytestmark = pytest.mark.timeout(600)


def run_validator(deploy_dir: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if deploy_dir is not None:
        env["DEPLOY_DIR"] = str(deploy_dir)
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, check=False,
                          timeout=580)


@pytest.fixture(scope="module")
def real_run() -> subprocess.CompletedProcess:
    return run_validator()


def test_deploy_tree_is_valid(real_run):
    out = real_run.stdout + real_run.stderr
    assert real_run.returncode == 0, out
    assert "all checks passed" in out
    # Every family of checks really ran (a skipped tool must not pass silently).
    passed = {line.split("] ok    ", 1)[1] for line in out.splitlines() if "] ok    " in line}
    strict = " (kustomize + kubernetes-validate --strict)"
    assert passed >= {"compose docker-compose", "compose docker-compose.cpu", "k8s gpu" + strict,
                      "k8s cpu-dev" + strict, "k8s gpu-multinode" + strict, "promtool prometheus.yml", "promtool prometheus-k8s.yml",
                      "dockerfiles", "configs of every container", "docs/metrics.md + dashboard"}, out


def _broken_copy(tmp_path: Path, rel: str, old: str, new: str) -> Path:
    copy = tmp_path / "deploy"
    shutil.copytree(ROOT / "deploy", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / rel
    text = target.read_text()
    assert old in text, f"{old!r} not in {rel}: update this test"
    target.write_text(text.replace(old, new, 1))
    return copy


BROKEN = [
    # (file, text, replacement, check expected to fail, its message)
    ("k8s/base/trainer.yaml", "  serviceName: trainer\n", "  serviceName: trainer\n  replicaz: 1\n",
     "k8s gpu", "replicaz"),
    ("k8s/base/reward.yaml", "  replicas: 2", "  replicas: two", "k8s gpu", "not of type 'integer'"),
    ("compose/docker-compose.yaml", 'expose: ["50053", "9103"]', "expose: 50053",
     "compose docker-compose", "expose"),
    ("prometheus/prometheus.yml", "scrape_interval: 5s", "scrape_interval: soon",
     "promtool prometheus.yml", "soon"),
    ("docker/reward.Dockerfile", "USER 10001:10001", "USER root", "dockerfiles", "non-root"),
    ("config/agrpo.yaml", "max_staleness: 4", "max_stalenes: 4", "configs of every container",
     "max_stalenes"),
    ("k8s/base/rollout.yaml", "grpc: {port: 50052}", "grpc: {port: 50051}", "configs of every container",
     "gRPC probes hit"),
]


@pytest.mark.parametrize("rel,old,new,check,message", BROKEN, ids=[b[0] + ":" + b[4] for b in BROKEN])
def test_broken_deploy_fails(tmp_path, real_run, rel, old, new, check, message):
    result = run_validator(_broken_copy(tmp_path, rel, old, new))
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert f"FAIL  {check}" in out, out
    assert message in out, out


def test_dashboard_reads_only_existing_series():
    """The dashboard check itself catches a renamed metric."""
    import dashboard
    import gen_observability
    import metrics_catalog

    known = metrics_catalog.known_names(metrics_catalog.all_metrics())
    assert gen_observability.unknown_series(dashboard.exprs(dashboard.build()), known | {"up"}) == []
    assert gen_observability.unknown_series(["rate(agrpo_trainer_stepz_total[1m])"], known) == \
        ["agrpo_trainer_stepz_total"]


def test_dashboard_covers_the_issue_topics():
    board = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "agrpo.json").read_text())
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p.get("targets", []))
    for series in ("agrpo_trainer_step", "agrpo_trainer_policy_version", "agrpo_rollout_reward",
                   "agrpo_trainer_sample_staleness_versions", "agrpo_trainer_samples_dropped_total",
                   "agrpo_trainer_buffered_samples", "agrpo_rollout_generation_tokens_per_second",
                   "agrpo_trainer_idle_fraction", "agrpo_trainer_weight_sync_seconds",
                   "agrpo_reward_request_latency_seconds", "agrpo_reward_function_failures_total"):
        assert re.search(rf"\b{re.escape(series)}", exprs), series
