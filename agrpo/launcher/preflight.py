"""Everything `agrpo run` checks before it starts a process: one line per mistake."""

from __future__ import annotations

from pathlib import Path

from agrpo.services.common.imports import missing_module
from agrpo.services.common.preflight import (
    StartupError,
    check_dataset,
    check_model,
    check_service_ports,
    check_vllm_urls,
)


def check_job(cfg, config_dir: Path | None = None) -> None:
    """Ports of all three services, the model, the data, the reward names, the user code the
    services will load (beside the config file, on sys_path or PYTHONPATH) and the vLLM URLs."""
    for name in ("trainer", "rollout", "reward"):
        check_service_ports(cfg, name)
    check_model(cfg)
    check_dataset(cfg, config_dir)
    from agrpo.services.reward import check_reward_names as check_names

    check_names(cfg)
    check_user_code(cfg, [*cfg.sys_path, *([str(config_dir)] if config_dir else [])])
    check_vllm_urls(cfg)


def check_user_code(cfg, folders: list[str]) -> None:
    """Each reward function, tool and environment reference names a module that can be found."""
    env = cfg.environment_factory
    refs = [(f"reward_funcs[{i}]", f.name) for i, f in enumerate(cfg.reward_funcs)]
    refs += [(f"tools[{i}]", t) for i, t in enumerate(cfg.tools)]
    refs += [(f"environment_factory[{k!r}]", v) for k, v in env.items()] if isinstance(env, dict) else \
        [("environment_factory", env)] if env else []
    for key, ref in refs:
        problem = missing_module(ref, folders)
        if problem:
            raise StartupError(f"{key}={ref!r}: {problem}")
