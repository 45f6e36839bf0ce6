"""The `agrpo` command: `agrpo <service> [--config FILE] [--key value ...]`.

Heavy modules are imported only by the subcommand that needs them, so `agrpo --help`
answers at once. A bad config exits with status 2 and one line naming the key.
"""

from __future__ import annotations

import importlib
import sys

from agrpo.services.common.entry import CONFIG_HELP, SERVICES, run_service

COMMANDS = {
    **SERVICES,
    "run": ("agrpo.launcher.cli", "Run a whole job: vLLM, reward, trainer, rollout (see --help)."),
    "vllm": ("agrpo.launcher.cli", "Start the vLLM server agrpo needs, or print its command (see --help)."),
    "audit": ("agrpo.services.trainer.audit", "Check a run's audit log: every prompt once, nothing past max_staleness."),
    "demo": ("agrpo.demo.cli", "Run the whole system locally and train a small task (see --help)."),
    "merge": ("agrpo.services.trainer.merge", "Merge a LoRA checkpoint into its base model (see --help)."),
}

USAGE = """usage: agrpo <command> [--config FILE] [--key value ...]
       agrpo --version

commands:
{commands}

"""


def _usage() -> str:
    lines = "\n".join(f"  {name:<9}{doc}" for name, (_, doc) in COMMANDS.items())
    return USAGE.format(commands=lines) + CONFIG_HELP


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a service (services/common/entry.py) or a tool; return the exit status."""
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
    if command in ("demo", "audit", "merge"):  # their own options, not config keys
        return int(importlib.import_module(COMMANDS[command][0]).main(rest) or 0)
    if command in ("run", "vllm"):
        from agrpo.launcher import cli as launcher

        return int((launcher.run_main if command == "run" else launcher.vllm_main)(rest) or 0)
    return run_service(command, rest, usage=_usage)


if __name__ == "__main__":
    sys.exit(main())
