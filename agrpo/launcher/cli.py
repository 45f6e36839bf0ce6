"""`agrpo run CONFIG [--key value ...]`: a whole job on this machine, and `agrpo vllm MODEL`.

Run:   agrpo run job.yaml                      (vLLM started too, unless one answers already)
       agrpo run job.yaml --max_steps 20       (any config key, as for the services)
       agrpo vllm ./my-model --port 8000        (the vLLM server agrpo would start, by hand)
       agrpo vllm ./my-model --print            (only print that command)
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

RUN_USAGE = """usage: agrpo run CONFIG.yaml [--key value ...]

Starts vLLM (unless vllm_server_base_url already answers), then the reward, trainer and
rollout services under a supervisor; shows progress; exits 0 when training is done.
Ctrl-C stops cleanly (the trainer finishes its step); a second Ctrl-C kills everything.
Keys: docs/config.md (the launcher section says what `agrpo run` starts)."""


def run_main(argv: list[str]) -> int:
    """`agrpo run`: the exit status (0 done, 1 failed, 2 bad config, 130 interrupted)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(RUN_USAGE)
        return 0 if argv else 2
    from agrpo.services.common.config import ConfigError, load_config
    from agrpo.services.common.preflight import STARTUP_ERROR_EXIT, StartupError

    from .job import Job, JobOptions

    config_path, flags = Path(argv[0]), tuple(argv[1:])
    if not config_path.is_file():
        print(f"agrpo run: config file {config_path} not found", file=sys.stderr)
        return STARTUP_ERROR_EXIT
    try:
        cfg = load_config(["--config", str(config_path), *flags], {k: v for k, v in os.environ.items()
                                                                  if k != "AGRPO_CONFIG"})
    except ConfigError as exc:
        print(f"agrpo run: config error: {exc}", file=sys.stderr)
        return STARTUP_ERROR_EXIT
    job = Job(cfg, JobOptions(config_path.resolve(), flags))
    try:
        return job.run()
    except StartupError as exc:
        print(f"agrpo run: {exc}", file=sys.stderr)
        return STARTUP_ERROR_EXIT
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"agrpo run: failed: {exc}\nagrpo run: logs in {job.logs}", file=sys.stderr)
        return 1


def vllm_main(argv: list[str]) -> int:
    """`agrpo vllm MODEL`: start (or print) the vLLM server agrpo expects."""
    p = argparse.ArgumentParser(prog="agrpo vllm", description="Start a vLLM server the way agrpo needs it: "
                                "dev mode, processed logprobs, weight transfer, our worker extension.")
    p.add_argument("model", help="model folder")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    p.add_argument("--gpu", default="0", help="CUDA device (GPU)")
    p.add_argument("--max-model-len", type=int, default=None, help="default: 2048, capped at the model's own limit")
    p.add_argument("--kv-cache-gib", type=float, default=None, help="default: 0.5 on CPU, 2 on GPU (agrpo run sizes "
                   "it for max_inflight_tasks full-length sequences)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--lora-rank", type=int, default=None,
                   help="serve LoRA adapters up to this rank, loaded at run time (a trainer with peft: set)")
    p.add_argument("--max-loras", type=int, default=6, help="adapters held at once, with --lora-rank: "
                   "at least the trainer's max_staleness + 2 (default 6: max_staleness 4)")
    p.add_argument("--print", action="store_true", help="print the command and its environment only")
    a = p.parse_args(argv)
    from agrpo.launcher.vllm_process import lora_args

    from .vllm_plan import KV_FLOOR_GIB, VllmSettings, default_max_len, has_gpu

    if not Path(a.model).is_dir():
        p.error(f"{a.model}: no such model folder")
    gpu = a.device == "gpu" or (a.device == "auto" and has_gpu())
    settings = VllmSettings(str(Path(a.model).resolve()), a.port, gpu, a.max_model_len or default_max_len(a.model, 2048),
                            a.kv_cache_gib or KV_FLOOR_GIB[gpu], a.gpu, a.gpu_memory_utilization,
                            lora_args(a.lora_rank, a.max_loras) if a.lora_rank else ())
    server = settings.server()
    cmd, env = server.command(), server.env()
    shown = server.env_updates({})
    print(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in sorted(shown.items())), *map(shlex.quote, cmd)]))
    if a.print:
        return 0
    os.execve(cmd[0] if os.path.isabs(cmd[0]) else shutil_which(cmd[0]), cmd, env)
    return 0  # not reached


def shutil_which(name: str) -> str:
    import shutil

    found = shutil.which(name)
    if not found:
        raise SystemExit(f"agrpo vllm: {name} not found")
    return found
