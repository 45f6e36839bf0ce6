"""The wheel is what we test and ship: built from this checkout, installed with its extras into a
fresh venv (torch pinned as scripts/setup_env.sh pins it), it puts one name in site-packages and
runs TRL's quick-start shape from a folder outside the repository: a tiny model, an in-memory
dataset, a reward module beside the script, started from a third folder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from trainer_helpers import restore_server
from vllm_server import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
TORCH_PIN = "torch==2.13.0"


def _sh(argv: list, cwd: Path | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([str(a) for a in argv], cwd=cwd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True,
                       text=True, timeout=timeout, check=False)
    assert r.returncode == 0, f"{argv}: {r.stdout[-3000:]}{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the python of a fresh venv that installed it with [all])."""
    root = tmp_path_factory.mktemp("wheel")
    _sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", root / "dist", ROOT], timeout=600)
    (wheel,) = (root / "dist").glob("agrpo-*.whl")
    _sh([sys.executable, "-m", "venv", root / "venv"])
    python = root / "venv" / "bin" / "python"
    _sh([python, "-m", "pip", "install", "-q", TORCH_PIN])
    _sh([python, "-m", "pip", "install", "-q", f"{wheel}[all]", TORCH_PIN])
    return wheel, python


def test_the_wheel_holds_one_top_level_name(installed):
    wheel, python = installed
    names = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {n for n in names if not n.endswith(".dist-info")} == {"agrpo"}, names
    assert _sh([python.parent / "agrpo", "--version"]).stdout.strip().startswith("agrpo ")
    here = _sh([python, "-c", "import agrpo.services.trainer.loop as m; print(m.__file__)"], cwd=python.parent)
    assert "site-packages" in here.stdout  # the installed copy, not this checkout


@pytest.fixture
def shared(vllm_server, tiny_model_dir):
    yield vllm_server
    restore_server(vllm_server, tiny_model_dir)


def test_trls_quick_start_trains_from_the_installed_wheel(installed, shared, tiny_model_dir, tmp_path):
    _, python = installed
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_rewards.py").write_text(textwrap.dedent('''
        def digit_reward(completions, **kwargs):
            return [sum(ch.isdigit() for ch in c[0]["content"]) / 10 for c in completions]
    '''))
    ports = {name: free_port() for name in ("trainer", "rollout", "reward")}
    (project / "train.py").write_text(textwrap.dedent(f"""
        from datasets import Dataset
        from my_rewards import digit_reward

        from agrpo import AsyncGRPOConfig, AsyncGRPOTrainer
        from agrpo.rewards import think_format_reward

        dataset = Dataset.from_list([{{"prompt": [{{"role": "user", "content": f"What is {{i}} + 1?"}}]}}
                                     for i in range(16)])
        trainer = AsyncGRPOTrainer(
            model={str(tiny_model_dir)!r},
            reward_funcs=[digit_reward, think_format_reward],
            train_dataset=dataset,
            args=AsyncGRPOConfig(output_dir={str(tmp_path / "out")!r}, max_steps=3, num_generations=4,
                                 per_device_train_batch_size=8, max_completion_length=12,
                                 vllm_server_base_url={shared.base_url!r}, disable_tqdm=True,
                                 trainer={{"port": {ports["trainer"]}, "metrics_port": None}},
                                 rollout={{"port": {ports["rollout"]}, "metrics_port": None}},
                                 reward={{"port": {ports["reward"]}, "metrics_port": None, "num_workers": 1}}),
        )
        trainer.train()
        print("TRAINED")
    """))
    third = tmp_path / "third"
    third.mkdir()
    r = _sh([python, project / "train.py"], cwd=third)
    assert "TRAINED" in r.stdout
    lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3 and '"rewards/think_format_reward' in lines[-1]
