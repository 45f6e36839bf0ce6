"""The `agrpo` command: `agrpo <service> [--config FILE] [--key value ...]`.

Heavy modules are imported only by the subcommand that needs them, so `agrpo --help`
answers at once. A bad config exits with status 2 and one line naming the key.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "reward": ("agrpo.services.reward.server", "Serve the reward API (RewardService)."),
    "rollout": ("agrpo.services.rollout.server", "Generate with vLLM, score, stream samples to the trainer."),
    "trainer": ("agrpo.services.trainer.server", "Train on samples, sync weights into vLLM, publish versions."),
    "run": ("agrpo.launcher.cli", "Run a whole job: vLLM, reward, trainer, rollout (see --help)."),
    "vllm": ("agrpo.launcher.cli", "Start the vLLM server agrpo needs, or print its command (see --help)."),
    "audit": ("agrpo.services.trainer.audit", "Check a run's audit log: every prompt once, nothing past max_staleness."),
    "demo": ("agrpo.demo.cli", "Run the whole system locally and train a small task (see --help)."),
}

USAGE = """usage: agrpo <command> [--config FILE] [--key value ...]
       agrpo --version

commands:
{commands}

Configuration: defaults < YAML file (--config or AGRPO_CONFIG) < environment
(AGRPO_<KEY>, AGRPO_<SECTION>__<KEY>) < flags (--key value, --section.key value).
Keys are AsyncGRPOConfig's (e.g. --max_staleness 2) plus the service sections
(--trainer.port 50051). See docs/config.md."""


def _usage() -> str:
    lines = "\n".join(f"  {name:<9}{doc}" for name, (_, doc) in COMMANDS.items())
    return USAGE.format(commands=lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a service's `main(cfg)`; return the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from agrpo import __version__

        print(f"agrpo {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"agrpo: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if command in ("demo", "audit"):  # their own options, not config keys
        return int(importlib.import_module(COMMANDS[command][0]).main(rest) or 0)
    if command in ("run", "vllm"):
        from agrpo.launcher import cli as launcher

        return int((launcher.run_main if command == "run" else launcher.vllm_main)(rest) or 0)
    if any(a in ("-h", "--help") for a in rest):
        print(f"agrpo {command}: {COMMANDS[command][1]}\n\n{_usage()}")
        return 0
    from agrpo.services.common.config import ConfigError, load_config

    try:
        cfg = load_config(rest)
    except ConfigError as exc:
        print(f"agrpo {command}: config error: {exc}", file=sys.stderr)
        return 2
    from agrpo.services.common.imports import adopt_sys_path
    from agrpo.services.common.preflight import STARTUP_ERROR_EXIT, StartupError

    adopt_sys_path(cfg.sys_path)  # user code resolves as in a spawned child of the user's script

    module = importlib.import_module(COMMANDS[command][0])
    try:
        if hasattr(module, "preflight"):
            module.preflight(cfg)
        return int(module.main(cfg) or 0)
    except StartupError as exc:
        print(f"agrpo {command}: {exc}", file=sys.stderr)
        return STARTUP_ERROR_EXIT


if __name__ == "__main__":
    sys.exit(main())
