"""A user's own project imports agrpo and trains, wherever it is started from.

- The project has packages named as ours were (`services`, `common`, `api`, `demo`); each one
  raises if imported, so agrpo must never import them.
- A TRL script ported by changing the import, with its reward module beside it, started from
  the project's root (`python jobs/train.py`), and one that puts a folder on sys.path and then
  changes directory: the services load the reward as a spawned child of the script would.
- The same script with TRL's `peft_config=LoraConfig(...)` trains an adapter; the vLLM it starts
  takes adapters at run time and receives the adapter alone, not the model.
- `agrpo run job.yaml` from another folder finds the module beside job.yaml; a module that
  is nowhere is one line naming the reference and the folders searched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from trainer_helpers import restore_server
from vllm_server import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(900)]

REWARDS = '''
def digit_reward(completions, **kwargs):
    """A user's own reward beside the script."""
    return [sum(ch.isdigit() for ch in c[0]["content"]) / 10 for c in completions]
'''


@pytest.fixture
def shared(vllm_server, tiny_model_dir):
    yield vllm_server
    restore_server(vllm_server, tiny_model_dir)


def _project(root: Path) -> Path:
    """A project with its own services/, common/, api/ and demo/ packages."""
    for name in ("services", "common", "api", "demo"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(f"raise ImportError('the project\\'s own {name} was imported')\n")
    (root / "jobs").mkdir()
    (root / "jobs" / "my_rewards.py").write_text(REWARDS)
    return root


def _script(body: str, server, model_dir: Path, out: Path, extra: str = "", url: str = "") -> str:
    ports = {name: free_port() for name in ("trainer", "rollout", "reward")}
    return textwrap.dedent(f"""
        import os
        import sys
        {body}
        from datasets import Dataset
        from agrpo import AsyncGRPOConfig, AsyncGRPOTrainer

        if __name__ == "__main__":
            dataset = Dataset.from_list([{{"prompt": [{{"role": "user", "content": f"What is {{i}} + 1?"}}]}}
                                         for i in range(16)])
            args = AsyncGRPOConfig(output_dir={str(out)!r}, max_steps=2, num_generations=4,
                                   per_device_train_batch_size=8, max_completion_length=12,
                                   vllm_server_base_url={url or server.base_url!r}, disable_tqdm=True,
                                   launcher={{"generation": "vllm"}},
                                   trainer={{"port": {ports["trainer"]}, "metrics_port": None}},
                                   rollout={{"port": {ports["rollout"]}, "metrics_port": None}},
                                   reward={{"port": {ports["reward"]}, "metrics_port": None, "num_workers": 1}})
            AsyncGRPOTrainer(model={str(model_dir)!r}, reward_funcs=digit_reward, train_dataset=dataset,
                             args=args{extra}).train()
            print("TRAINED")
    """)


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(argv, cwd=cwd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600, check=False)


def _steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_ported_script_trains_beside_its_own_services_package(shared, tiny_model_dir, tmp_path):
    project = _project(tmp_path / "project")
    script = project / "jobs" / "train.py"
    script.write_text(_script("from my_rewards import digit_reward", shared, tiny_model_dir, tmp_path / "out"))
    r = _run([sys.executable, "jobs/train.py"], cwd=project)  # the project's own packages are importable here
    assert r.returncode == 0 and "TRAINED" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    assert _steps(tmp_path / "out") == [1, 2]
    config = yaml.safe_load((tmp_path / "out" / "api" / "agrpo.yaml").read_text())
    assert config["reward_funcs"] == [{"name": "my_rewards:digit_reward"}]  # by reference, not a pickle
    assert str(project / "jobs") in config["sys_path"]


def test_a_ported_script_with_peft_config_trains_an_adapter(shared, tiny_model_dir, tmp_path):
    project = _project(tmp_path / "project")
    script = project / "jobs" / "train.py"
    body = "from my_rewards import digit_reward\n        from peft import LoraConfig"
    lora = ", peft_config=LoraConfig(r=8, lora_alpha=16, target_modules='all-linear', task_type='CAUSAL_LM')"
    own = f"http://127.0.0.1:{free_port()}"  # no server there: the job starts one, with LoRA's flags
    script.write_text(_script(body, shared, tiny_model_dir, tmp_path / "out", lora, own))
    r = _run([sys.executable, "jobs/train.py"], cwd=project)
    assert r.returncode == 0 and "TRAINED" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    assert _steps(tmp_path / "out") == [1, 2]
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    sent = [row["perf/weight_sync_mb"] for row in rows if "perf/weight_sync_mb" in row]
    full_mb = sum(f.stat().st_size for f in tiny_model_dir.glob("*.safetensors")) / 2**20
    assert sent and max(sent) < 0.25 * full_mb, (sent, full_mb)  # the adapter, not the model (merged: 0.53)
    final = max((tmp_path / "out").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert (final / "adapter_config.json").exists() and not (final / "model.safetensors").exists()


def test_a_script_that_extends_sys_path_then_changes_directory_trains(shared, tiny_model_dir, tmp_path):
    project = _project(tmp_path / "project")
    (project / "jobs" / "my_rewards.py").rename(project / "jobs" / "scorers.py")
    body = ("sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'jobs'))\n"
            f"        os.chdir({str(tmp_path)!r})\n"
            "        from scorers import digit_reward")
    script = project / "train.py"
    script.write_text(_script(body, shared, tiny_model_dir, tmp_path / "out"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = _run([sys.executable, str(script)], cwd=elsewhere)
    assert r.returncode == 0 and "TRAINED" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    assert _steps(tmp_path / "out") == [1, 2]


def _job(folder: Path, server, model_dir: Path, out: Path, reward: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "my_rewards.py").write_text(REWARDS)
    with open(folder / "prompts.jsonl", "w") as f:
        for i in range(16):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"What is {i} + 1?"}]}) + "\n")
    cfg = {"model": str(model_dir), "vllm_server_base_url": server.base_url,
           "dataset": {"path": "json", "data_files": str(folder / "prompts.jsonl")}, "reward_funcs": [reward],
           "num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 12, "max_steps": 2,
           "output_dir": str(out), "gradient_checkpointing": False, "log_format": "text", "disable_tqdm": True,
           "trainer": {"port": free_port(), "metrics_port": None},
           "rollout": {"port": free_port(), "metrics_port": None},
           "reward": {"port": free_port(), "metrics_port": None, "num_workers": 1}}
    (folder / "job.yaml").write_text(yaml.safe_dump(cfg))
    return folder / "job.yaml"


def test_agrpo_run_finds_the_module_beside_its_config_from_any_folder(shared, tiny_model_dir, tmp_path):
    job = _job(tmp_path / "user", shared, tiny_model_dir, tmp_path / "out", "my_rewards:digit_reward")
    elsewhere = _project(tmp_path / "elsewhere")
    r = _run([sys.executable, "-m", "agrpo.cli", "run", str(job)], cwd=elsewhere)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert _steps(tmp_path / "out") == [1, 2]


def test_agrpo_run_profiles_the_steps_asked_for_and_says_where(shared, tiny_model_dir, tmp_path):
    job = _job(tmp_path / "user", shared, tiny_model_dir, tmp_path / "out", "my_rewards:digit_reward")
    cfg = yaml.safe_load(job.read_text())
    cfg["trainer"]["profile_steps"] = [2, 2]
    job.write_text(yaml.safe_dump(cfg))
    r = _run([sys.executable, "-m", "agrpo.cli", "run", str(job)], cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    folder = tmp_path / "out" / "profile"
    assert (folder / "steps_2-2.txt").read_text().startswith("steps 2-2: ")
    assert "aten::" in (folder / "steps_2-2.txt").read_text() and (folder / "trace_2-2.json.gz").stat().st_size
    assert f"profile of steps 2-2 in {folder}" in r.stdout


def test_a_module_found_nowhere_is_one_line_naming_it_and_the_folders(tiny_model_dir, tmp_path):
    server = type("S", (), {"base_url": "http://127.0.0.1:9"})()  # never reached: the check comes first
    job = _job(tmp_path / "user", server, tiny_model_dir, tmp_path / "out", "no_such_rewards:score")
    r = _run([sys.executable, "-m", "agrpo.cli", "run", str(job)], cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "reward_funcs[0]='no_such_rewards:score'" in lines[0] and str(tmp_path / "user") in lines[0], lines[0]
