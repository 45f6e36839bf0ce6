"""The launcher's decisions before anything starts: trainer GPUs, command lines, restarts."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from agrpo.launcher.gpus import trainer_devices
from agrpo.launcher.processes import agrpo_argv
from agrpo.launcher.supervisor import RestartPolicy, Supervised
from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.preflight import StartupError


def _cfg(ranks: int = 1, **launcher) -> AgrpoConfig:
    return AgrpoConfig(trainer={"num_processes": ranks}, launcher=launcher)


@pytest.mark.parametrize(("count", "ranks", "launcher", "expected"), [
    (1, 1, {}, "0"),                                # one GPU: the trainer shares vLLM's
    (2, 1, {}, "1"),                                # the first GPU vLLM does not use
    (8, 4, {}, "1,2,3,4"),                          # one per rank
    (8, 0, {}, "1,2,3,4,5,6,7"),                    # 0: one rank per GPU vLLM does not use
    (4, 2, {"vllm_gpu": "3"}, "0,1"),
    (4, 2, {"trainer_gpus": "2,3,1"}, "2,3"),       # the first num_processes given
])
def test_trainer_devices(count, ranks, launcher, expected):
    assert trainer_devices(_cfg(ranks, **launcher), count) == expected


@pytest.mark.parametrize(("count", "ranks", "launcher", "says"), [
    (1, 1, {"trainer_gpus": "1"}, "launcher.trainer_gpus='1': this machine has 1 GPU(s)"),
    (2, 1, {"vllm_gpu": "2"}, "launcher.vllm_gpu='2'"),
    (2, 1, {"trainer_gpus": "one"}, "launcher.trainer_gpus='one': a comma-separated list of GPU indices"),
    (2, 2, {}, "trainer.num_processes=2: one GPU per rank, and launcher.trainer_gpus gives 1 (1)"),
])
def test_trainer_devices_refuses_with_one_line(count, ranks, launcher, says):
    with pytest.raises(StartupError, match="^" + re.escape(says)):
        trainer_devices(_cfg(ranks, **launcher), count)


def test_service_command_line_pinned_where_asked():
    one = agrpo_argv("trainer", Path("job.yaml"), "--max_steps", "3")
    assert one == [sys.executable, "-m", "agrpo.cli", "trainer", "--config", "job.yaml", "--max_steps", "3"]
    assert agrpo_argv("trainer", Path("job.yaml"), cpus="1") == ["taskset", "-c", "1", *one[:6]]


class _Process:
    """A stand-in service process: exits with the next code of `codes` after each start."""

    name = "trainer"

    def __init__(self, codes: list[int]) -> None:
        self.codes, self.starts, self.proc = codes, 0, type("P", (), {"returncode": None})()

    def start(self) -> None:
        self.proc.returncode = self.codes[self.starts]
        self.starts += 1

    def alive(self) -> bool:
        return False

    def log_tail(self, lines: int = 20) -> str:
        return "trainer.model: cannot load" if lines == 1 else "last lines"


def test_restarts_back_off_then_give_up_with_the_last_lines():
    now = [0.0]
    said: list[str] = []
    svc = Supervised(_Process([1, 1, 1]), RestartPolicy(max_restarts=2, backoff_s=2), say=said.append,
                     clock=lambda: now[0])
    svc.start()
    assert svc.check() is None and svc.restart_at == 2.0  # first crash: 2 s
    now[0] = 2.0
    assert svc.check() is None and svc.process.starts == 2
    assert svc.check() is None and svc.restart_at == 6.0  # second: 4 s
    now[0] = 6.0
    svc.check()
    message = svc.check()
    assert message.startswith("trainer exited with code 1 3 times within 600 s") and "last lines" in message
    assert len(said) == 2 and "restarting in 2 s" in said[0] and "restarting in 4 s" in said[1]


def test_exit_0_is_done_and_exit_2_ends_the_job_with_its_line():
    done = Supervised(_Process([0]))
    done.start()
    assert done.check() is None and done.done
    fatal = Supervised(_Process([2]))
    fatal.start()
    with pytest.raises(StartupError, match=r"^trainer\.model: cannot load$"):
        fatal.check()


class _Server:
    def __init__(self, gpu: bool) -> None:
        self.gpu = gpu


@pytest.mark.parametrize("gpus,servers,transport,expected", [
    ("0", [_Server(True)], "auto", "ipc"),          # one GPU: vLLM and the trainer share it
    ("1", [_Server(True)], "auto", None),           # two GPUs: NCCL (the trainer's auto)
    (None, [_Server(False)], "auto", "shared_path"),  # CPU: a file per version
    ("0", [_Server(True)], "nccl", None),           # the user's choice stands
    ("0", [], "auto", None),                        # vLLM not started by the job: its GPU is unknown
])
def test_the_trainer_transport_follows_where_the_job_put_vllm(tmp_path, gpus, servers, transport, expected):
    from agrpo.launcher.job import Job, JobOptions

    cfg = AgrpoConfig.model_validate({"output_dir": str(tmp_path), "vllm_server_base_url": "http://127.0.0.1:8000",
                                      "trainer": {"weight_transport": transport}})
    job = Job(cfg, JobOptions(config_path=tmp_path / "c.yaml"))
    job.trainer_gpus, job.vllm_servers = gpus, servers
    assert job._env("trainer").get("AGRPO_TRAINER__WEIGHT_TRANSPORT") == expected


@pytest.mark.parametrize(("gpus", "max_steps", "keys", "expected"), [
    (0, 80, {}, True),                                      # CPU: the trainer generates
    (0, 10_000, {}, True),
    (1, 80, {}, True),                                      # one GPU, short: vLLM's start is not repaid
    (1, 1000, {}, False),                                   # one GPU, long: vLLM
    (1, 80, {"max_completion_length": 1024}, False),        # long completions: vLLM
    (2, 80, {}, False),                                     # a GPU for each: vLLM
    (1, 80, {"launcher": {"generation": "vllm"}}, False),   # stated
    (2, 1000, {"launcher": {"generation": "trainer"}}, True),
    (1, 80, {"launcher": {"vllm": "start"}}, False),
    (1, 80, {"trainer": {"weight_transport": "ipc"}}, False),
    (1, 80, {"launcher": {"device": "cpu"}}, True),
])
def test_who_generates(monkeypatch, gpus, max_steps, keys, expected):
    from agrpo.launcher import vllm_plan

    monkeypatch.setattr(vllm_plan, "gpu_count", lambda: gpus)
    monkeypatch.setattr(vllm_plan, "answers", lambda url, timeout_s=2.0: False)
    keys = {"max_completion_length": 24, **keys}
    assert vllm_plan.trainer_generates(AgrpoConfig(max_steps=max_steps, **keys)) is expected


@pytest.mark.parametrize(("keys", "flags"), [
    ({}, ()),                                                              # no peft: no LoRA in vLLM
    ({"peft": {"r": 12}}, ("--enable-lora", "--max-lora-rank", "16", "--max-loras", "4",  # rank 12 fits 16
                           "--enforce-eager")),
    ({"peft": {"r": 12}, "trainer": {"lora_sync": "adapter"}}, ("--enable-lora", "--max-lora-rank", "16",
                                                                "--max-loras", "4", "--enforce-eager")),
    ({"peft": {"r": 12}, "trainer": {"lora_sync": "merged"}}, ()),         # merged: vLLM never loads an adapter
])
def test_the_vllm_a_lora_job_starts_takes_adapters_unless_it_syncs_merged(keys, flags):
    from agrpo.launcher.vllm_plan import lora_flags

    assert lora_flags(AgrpoConfig(max_staleness=2, **keys)) == flags


def test_the_users_vllm_args_come_last_after_loras_in_the_demo_and_agrpo_run(monkeypatch, tiny_model_dir, tmp_path):
    from agrpo.demo import runner
    from agrpo.launcher.vllm_plan import extra_vllm_args

    cfg = AgrpoConfig(max_staleness=2, peft={"r": 12}, launcher={"vllm_args": ["--no-enforce-eager"]})
    flags = ("--enable-lora", "--max-lora-rank", "16", "--max-loras", "4", "--enforce-eager", "--no-enforce-eager")
    assert extra_vllm_args(cfg) == flags  # agrpo run's

    started = []

    def start(server):
        started.append(tuple(server.command()[-len(flags):]))
        raise RuntimeError("stop here")

    monkeypatch.setattr(runner.VLLMServer, "start", start)
    opts = runner.DemoOptions(out=tmp_path, model_path=tiny_model_dir, overrides={
        "peft": {"r": 12}, "launcher": {"generation": "vllm", "vllm_args": ["--no-enforce-eager"]}})
    with pytest.raises(RuntimeError, match="stop here"):
        runner.start_vllm_and_config(opts, {})
    assert started == [flags]  # the demo's


def test_a_vllm_that_answers_is_used(monkeypatch):
    from agrpo.launcher import vllm_plan

    monkeypatch.setattr(vllm_plan, "gpu_count", lambda: 1)
    monkeypatch.setattr(vllm_plan, "answers", lambda url, timeout_s=2.0: True)
    assert not vllm_plan.trainer_generates(AgrpoConfig(max_steps=80, max_completion_length=24))


def test_a_transport_the_launcher_chose_puts_back_what_it_does_not_read(tmp_path):
    """weight_transport auto, and the job picks local: keys meant for vLLM's transports go back
    to their defaults (they would do nothing), so the trainer starts; a named transport stays strict."""
    from agrpo.launcher.job import unread_sync_keys_reset
    from agrpo.services.common.config import ConfigError, load_config

    config = tmp_path / "job.yaml"
    config.write_text("trainer:\n  weight_load: vllm\n  recompute_in_flight: false\n  http_chunk_mb: 8\n")
    argv = ["--config", str(config)]
    env = unread_sync_keys_reset(load_config(argv, {}), "local")
    assert sorted(env) == ["AGRPO_TRAINER__HTTP_CHUNK_MB", "AGRPO_TRAINER__RECOMPUTE_IN_FLIGHT",
                           "AGRPO_TRAINER__WEIGHT_LOAD"]
    with pytest.raises(ConfigError, match=r"does nothing with trainer\.weight_transport=local"):
        load_config(argv, {"AGRPO_TRAINER__WEIGHT_TRANSPORT": "local"})
    started = load_config(argv, {"AGRPO_TRAINER__WEIGHT_TRANSPORT": "local", **env})
    assert started.trainer.weight_transport == "local"
    assert unread_sync_keys_reset(started, "local") == {}  # every unread key is at its default again
    assert unread_sync_keys_reset(load_config(argv, {}), "http") == {}  # http reads all three


class _Exited:
    """A service process that exited with `code` while the launcher waited for it to serve."""

    def __init__(self, code: int) -> None:
        self.proc = type("P", (), {"poll": lambda _self: code})()

    def wait_healthy(self, address, service, timeout_s) -> None:
        raise RuntimeError(f"trainer exited with code {self.proc.poll()}:\nlast lines")

    def log_tail(self, lines: int = 30) -> str:
        return "trainer.model: cannot load"


@pytest.mark.parametrize("code", [0, 1, 2])
def test_a_service_that_finished_during_start_up_is_done_not_failed(tmp_path, code):
    """A job shorter than the start-up: the trainer trains and exits 0 before its health check
    answers; that is done (watch() sees it so). Any other exit fails the start as before."""
    from agrpo.launcher.job import Job, JobOptions

    job = Job(AgrpoConfig.model_validate({"output_dir": str(tmp_path)}), JobOptions(config_path=tmp_path / "c.yaml"))
    job.services["trainer"] = type("S", (), {"process": _Exited(code)})()
    if code == 0:
        job._await_serving("trainer")
    else:
        with pytest.raises(StartupError if code == 2 else RuntimeError, match="cannot load" if code == 2 else "code 1"):
            job._await_serving("trainer")


def test_a_data_file_beside_the_config_but_not_here_is_named_in_the_one_line(tmp_path, monkeypatch):
    """Relative data_files are read from the current folder (as load_dataset does); started from
    another folder, the line says where the file is."""
    from agrpo.launcher.preflight import check_dataset

    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "data.jsonl").write_text('{"prompt": "1 + 1 ="}\n')
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    cfg = AgrpoConfig(dataset={"path": "json", "data_files": "data.jsonl"})
    with pytest.raises(StartupError, match=r"'data.jsonl' does not exist in .*elsewhere .*beside the config file: "
                                           r".*proj/data.jsonl\)$"):
        check_dataset(cfg, tmp_path / "proj")
    with pytest.raises(StartupError, match=r"'data.jsonl' does not exist$"):  # nowhere: no hint
        check_dataset(cfg, tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path / "proj")
    check_dataset(cfg, tmp_path / "proj")  # from the config's folder it is found


def test_vllms_kv_cache_holds_what_rollout_sends_at_once(tmp_path):
    """The KV cache agrpo starts vLLM with: room for max_inflight_tasks sequences of max_model_len
    (a Qwen2.5-1.5B shape: 28 layers x 2 KV heads x 128 x K and V x bf16 = 28 KiB a token), at least
    the floor, and launcher.kv_cache_gib when the user set it."""
    import json

    from agrpo.launcher.vllm_plan import KV_FLOOR_GIB, kv_cache_gib

    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 28, "num_attention_heads": 12,
                                                      "num_key_value_heads": 2, "hidden_size": 1536}))
    cfg = AgrpoConfig(model=str(tmp_path), per_device_train_batch_size=64, max_staleness=2)
    per_token = 2 * 28 * 2 * 128 * 2
    assert kv_cache_gib(cfg, 2048, gpu=True) == round(1.1 * 128 * 2048 * per_token / 2**30, 2)
    small = AgrpoConfig(model=str(tmp_path), per_device_train_batch_size=8, max_staleness=1)
    assert kv_cache_gib(small, 512, gpu=True) == KV_FLOOR_GIB[True]
    assert kv_cache_gib(AgrpoConfig(model=str(tmp_path), launcher={"kv_cache_gib": 3.5}), 2048, gpu=True) == 3.5
    assert kv_cache_gib(AgrpoConfig(model=str(tmp_path / "missing")), 2048, gpu=False) == KV_FLOOR_GIB[False]
