"""Start and stop a real vLLM OpenAI server (from ``.venv-vllm``): tests and the demo.

Why a subprocess: vLLM lives in its own venv (its pins clash with the project's),
and it spawns EngineCore/worker children, so we run it in its own process group
and tear the whole group down by PID. Start-up takes tens of seconds on a CPU
(docs/architecture.md, "Who generates"), so tests share one server per session (see ``tests/conftest.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from agrpo.services.common.lifetime import dying_with_this_process
from agrpo.services.common.ports import free_port
from agrpo.services.common.timeouts import (
    GENERATE_PROBE_TIMEOUT_S,
    PROCESS_EXIT_WAIT_S,
    VLLM_GET_TIMEOUT_S,
    VLLM_PROBE_TIMEOUT_S,
    VLLM_REQUEST_TIMEOUT_S,
    VLLM_START_POLL_TIMEOUT_S,
    VLLM_START_TIMEOUT_S,
    VLLM_STOP_GRACE_S,
)

from .affinity import pin_threads

REPO_ROOT = Path(__file__).resolve().parents[2]


# NVLink multicast off in every process on shared multi-GPU hosts (it can take the host's
# GPUs out of service); NCCL_CUMEM_ENABLE=0 because vLLM's workers use it and both NCCL
# ends must agree.
NCCL_SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1", "NCCL_CUMEM_ENABLE": "0"}
WORKER_EXTENSION = "agrpo_vllm_plugin.worker.AgrpoWorkerExtension"

# Reads vLLM's argument definitions as text: importing vllm costs seconds (and CUDA init).
_SCALE_OUT_PROBE = """
import importlib.util, pathlib, sys

spec = importlib.util.find_spec("vllm")
if spec is None or not spec.origin:
    sys.exit(2)
root = pathlib.Path(spec.origin).parent
files = [root / "engine" / "arg_utils.py", *(root / "entrypoints").rglob("cli_args.py")]
print(any("enable_scale_out" in f.read_text(errors="replace") for f in files if f.is_file()))
"""


def vllm_python() -> Path:
    """The vLLM venv's interpreter; override with AGRPO_VLLM_PYTHON (a path, or a command
    name looked up on PATH, e.g. `python3` on a GPU machine with vLLM on PYTHONPATH)."""
    value = os.environ.get("AGRPO_VLLM_PYTHON")
    if not value:
        return REPO_ROOT / ".venv-vllm" / "bin" / "python"
    found = shutil.which(value) if os.sep not in value else None
    return Path(found or value)


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM's --max-lora-rank accepts."""


def lora_args(rank: int, slots: int) -> tuple[str, ...]:
    """vLLM's flags for a LoRA trainer's adapter-only sync: adapters of `rank`, `slots` at once
    (AgrpoConfig.adapter_slots). VLLMServer adds VLLM_ALLOW_RUNTIME_LORA_UPDATING when they are given.
    Eager steps: adapters under DECODE_GRAPHS were never run here (`--no-enforce-eager` after
    these, in launcher.vllm_args, tries them)."""
    fitting = next((r for r in LORA_RANKS if r >= rank), rank)
    return ("--enable-lora", "--max-lora-rank", str(fitting), "--max-loras", str(slots), "--enforce-eager")


def supports_scale_out(python: Path | None = None) -> bool:
    """Whether this vLLM install knows `--enable-scale-out` (0.32 does, 0.26 rejects it)."""
    try:
        out = subprocess.run([str(python or vllm_python()), "-c", _SCALE_OUT_PROBE], capture_output=True,
                             text=True, timeout=VLLM_PROBE_TIMEOUT_S, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == "True"


DECODE_GRAPHS = ("-cc.mode=none", "-cc.cudagraph_mode=FULL_DECODE_ONLY")
"""vLLM on a GPU: decode steps replayed as CUDA graphs (at small batches a step is kernel
launches), without torch.compile (its start-up). Weight loads copy into the captured tensors."""


@dataclass(frozen=True)
class GpuProfile:
    """How to start vLLM on one NVIDIA GPU (bf16, NCCL weight transfer) instead of the CPU
    defaults. `worker_extension` None drops `--worker-extension-cls`."""

    gpu: str = "0"
    gpu_memory_utilization: float = 0.25
    kv_cache_gib: float | None = 2.0
    """KV cache size; None: what gpu_memory_utilization leaves. Why a cap: clearing the prefix
    cache (every weight sync) walks every KV block in Python, and a tiny model in a share of
    an H200 gets millions of blocks (docs/gpu.md, "Full loop on two GPUs", found on the device)."""
    max_model_len: int = 512
    attention_backend: str | None = "FLASH_ATTN"
    worker_extension: str | None = WORKER_EXTENSION
    scale_out: bool = False

    def args(self) -> tuple[str, ...]:
        out = ["--dtype", "bfloat16", *DECODE_GRAPHS, "--max-model-len", str(self.max_model_len),
               "--gpu-memory-utilization", str(self.gpu_memory_utilization),
               "--logprobs-mode", "processed_logprobs", "--weight-transfer-config", '{"backend":"nccl"}']
        if self.kv_cache_gib:
            out += ["--kv-cache-memory-bytes", str(int(self.kv_cache_gib * 2**30))]
        if self.attention_backend:
            out += ["--attention-backend", self.attention_backend]
        if self.worker_extension:
            out += ["--worker-extension-cls", self.worker_extension]
        if self.scale_out:
            out.append("--enable-scale-out")
        return tuple(out)

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """GPU pinning, dev mode (weight-transfer endpoints), multicast off; the plugin folder
        on PYTHONPATH so every vLLM process can import the worker extension."""
        paths = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
        plugin = str(REPO_ROOT / "vllm_plugin")
        if self.worker_extension and plugin not in paths:
            paths.append(plugin)
        return {"CUDA_VISIBLE_DEVICES": self.gpu, "VLLM_USE_FLASHINFER_SAMPLER": "0",
                "VLLM_SERVER_DEV_MODE": "1", **NCCL_SAFE_ENV, "PYTHONPATH": os.pathsep.join(paths)}


class VLLMServer:
    """``with VLLMServer(model_dir) as srv: srv.post_json("/v1/completions", {...})``."""

    # Settings that make a tiny fp32 model behave (and start fast) on CPU. The
    # processed_logprobs mode returns logprobs of the distribution actually sampled
    # from (after temperature), which is what GRPO importance ratios need.
    BASE_ARGS = (
        "--logprobs-mode", "processed_logprobs", "--dtype", "float32",
        "--enforce-eager",  # skip torch.compile: a much shorter start-up (docs/measurements/README.md)
        "--enable-scale-out",  # enables /inference/v1/generate (per-token weight_versions)
        "--weight-transfer-config", '{"backend":"cpu_http"}',  # our plugin (vllm_plugin/)
        # Our worker extension: on CPU it only answers (and refuses a direct load).
        "--worker-extension-cls", WORKER_EXTENSION,
    )

    def __init__(self, model_dir, port: int | None = None, extra_args=(), startup_timeout: float = VLLM_START_TIMEOUT_S,
                 gpu: GpuProfile | None = None, log_path: Path | None = None, cpus: str | None = None,
                 max_model_len: int = 512, kv_cache_gib: float = 0.125, front_cpus: str | None = None):
        self.model_dir = str(Path(model_dir).resolve())  # a relative path reads as a hub id
        self.model_name = self.model_dir  # vLLM's default served model name is the path
        self.port = port or free_port()
        self.extra_args = tuple(extra_args)
        self.startup_timeout = startup_timeout
        self.gpu = gpu
        self.cpus = cpus
        self.max_model_len, self.kv_cache_gib = max_model_len, kv_cache_gib  # CPU only (GpuProfile has its own)
        """CPU only: the cores vLLM runs on (taskset) and binds its model threads to."""
        self.front_cpus = front_cpus
        """CPU only: where the API server (the HTTP front) moves once the engine has started
        on `cpus`. On 2 cores its request handling otherwise takes the model's core
        (docs/measurements/async-measurements.md, "Where vLLM's core went")."""
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.workdir = Path(tempfile.mkdtemp(prefix="agrpo-vllm-"))
        self.log_path = Path(log_path) if log_path else self.workdir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def command(self) -> list[str]:
        # `python -m vllm.entrypoints.cli.main` == the `vllm` console script; it
        # needs the "vllm" dist-info shim that scripts/setup_env.sh installs.
        base = self.gpu.args() if self.gpu else (
            "--max-model-len", str(self.max_model_len),
            "--kv-cache-memory-bytes", str(int(self.kv_cache_gib * 2**30)), *self.BASE_ARGS)
        pin = ["taskset", "-c", self.cpus] if self.cpus and not self.gpu else []
        return [*pin, str(vllm_python()), "-m", "vllm.entrypoints.cli.main", "serve", self.model_dir,
                "--host", "127.0.0.1", "--port", str(self.port), *base, *self.extra_args]

    def env_updates(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The variables this server sets on top of `base` (dev mode, threads, GPU pinning)."""
        updates = dict(HF_HUB_OFFLINE="1", VLLM_SERVER_DEV_MODE="1", VLLM_NO_USAGE_STATS="1", OMP_NUM_THREADS="1")
        if "--enable-lora" in self.extra_args:  # adapters loaded at run time (trainer/weight_sync/adapter_sync.py)
            updates["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        if self.gpu:
            updates.update(self.gpu.env(dict(base if base is not None else os.environ)))
        elif self.cpus:
            updates["VLLM_CPU_OMP_THREADS_BIND"] = self.cpus
        return updates

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
        env.update(self.env_updates(env), VLLM_CACHE_ROOT=str(self.workdir / "cache"))
        return env

    def start(self) -> VLLMServer:
        if not vllm_python().exists():
            raise RuntimeError(f"{vllm_python()} not found; run scripts/setup_env.sh (or set AGRPO_VLLM_PYTHON)")
        t0 = time.monotonic()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            # the adapters it is sent go into its own work folder, removed at stop()
            env = {**self.env(), "AGRPO_LORA_DIR": str(self.workdir / "lora")}
            self.proc = subprocess.Popen(dying_with_this_process(self.command()), env=env, cwd=self.workdir,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)  # own process group for stop()
        try:
            self._wait_healthy(self.proc, t0 + self.startup_timeout)
            if self.front_cpus and not self.gpu:
                pin_threads(self.proc.pid, self.front_cpus)  # its engine and worker stay on `cpus`
            self._warm_up()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        return self

    def _warm_up(self) -> None:
        """One tiny request down the path rollout uses (token ids in, logprobs out): a fresh
        server's first one is many times slower than the rest (docs/measurements/README.md), and
        would otherwise land in the job's first step. Best effort: a server without that route is warmed by its first use."""
        try:
            model = self.get_json("/v1/models", timeout=VLLM_GET_TIMEOUT_S)["data"][0]["id"]
            self.post_json("/inference/v1/generate", {
                "request_id": "agrpo-warm-up", "token_ids": [1, 2, 3], "model": model,
                "sampling_params": {"max_tokens": 2, "temperature": 1.0, "logprobs": 0}}, timeout=GENERATE_PROBE_TIMEOUT_S)
        except (OSError, RuntimeError, ValueError, KeyError, IndexError):
            pass

    def _wait_healthy(self, proc: subprocess.Popen, deadline: float) -> None:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with code {proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=VLLM_START_POLL_TIMEOUT_S) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM not healthy after {self.startup_timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=n))
        except OSError:
            return "<no log>"

    def stop(self, grace: float = VLLM_STOP_GRACE_S) -> None:
        """SIGTERM the server by PID, then SIGKILL whatever is left of its process group.

        Only the API server gets SIGTERM: it shuts EngineCore/worker down itself
        (signalling the whole group at once makes the engine die first, so the API
        server logs a spurious traceback). Its children, e.g. multiprocessing's
        resource tracker that unlinks shared memory, get a moment to exit on their own.
        """
        if self.proc is None:
            return
        pgid = self.proc.pid  # == the group id, thanks to start_new_session
        deadline = time.monotonic() + grace
        try:
            self.proc.terminate()
            self.proc.wait(timeout=grace)
            while time.monotonic() < deadline:
                os.killpg(pgid, 0)  # raises ProcessLookupError once the group is empty
                time.sleep(0.1)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=PROCESS_EXIT_WAIT_S)
        self.proc = None
        for folder in ("cache", "lora"):  # keep server.log for debugging
            shutil.rmtree(self.workdir / folder, ignore_errors=True)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # Small JSON helpers (stdlib only, so tests need no HTTP client dependency).
    def request(self, method: str, path: str, body=None, timeout: float = VLLM_REQUEST_TIMEOUT_S):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path} -> {e.code}: {e.read()[:2000]!r}") from None
        return json.loads(raw) if raw else None

    def get_json(self, path: str, **kw):
        return self.request("GET", path, **kw)

    def post_json(self, path: str, body=None, **kw):
        return self.request("POST", path, {} if body is None else body, **kw)
