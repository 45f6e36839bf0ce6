"""Run one service from its command line: `run_service("trainer", ["--config", "run.yaml"])`.

The one entry behind `agrpo trainer|rollout|reward ...` (agrpo/cli.py) and
`python -m agrpo.services.<name>`, so the services never import the `agrpo` command.
A bad config exits with status 2 and one line naming the key; a StartupError with
STARTUP_ERROR_EXIT and its one line. Light at import: `agrpo --help` loads nothing heavy.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    from agrpo.services.common.config import AgrpoConfig

SERVICES: dict[str, tuple[str, str]] = {
    "reward": ("agrpo.services.reward.server", "Serve the reward API (RewardService)."),
    "rollout": ("agrpo.services.rollout.server", "Generate with vLLM, score, stream samples to the trainer."),
    "trainer": ("agrpo.services.trainer.server", "Train on samples, sync weights into vLLM, publish versions."),
}
"""name -> (its server module, one line of help)."""

CONFIG_HELP = """Configuration: defaults < YAML file (--config or AGRPO_CONFIG) < environment
(AGRPO_<KEY>, AGRPO_<SECTION>__<KEY>) < flags (--key value, --section.key value).
Keys are AsyncGRPOConfig's (e.g. --max_staleness 2) plus the service sections
(--trainer.port 50051). See docs/config.md."""


class ServiceModule(Protocol):
    """What a service's server module offers its entry: checks, then the service itself."""

    def preflight(self, cfg: AgrpoConfig) -> None:
        """Raise StartupError (one line naming the key) for a config that cannot start."""

    def main(self, cfg: AgrpoConfig) -> int:
        """Run the service until it stops; the exit status."""


def service_usage(name: str) -> str:
    """Help for one service on its own (`python -m agrpo.services.<name> --help`)."""
    return f"usage: agrpo {name} [--config FILE] [--key value ...]\n\n{CONFIG_HELP}"


def run_service(name: str, argv: list[str], usage: Callable[[], str] | None = None) -> int:
    """Load the config from argv, run the service's preflight and main; the exit status.
    `usage`: the help printed after the service's line (default: service_usage)."""
    module_name, doc = SERVICES[name]
    if any(a in ("-h", "--help") for a in argv):
        print(f"agrpo {name}: {doc}\n\n{usage() if usage else service_usage(name)}")
        return 0
    from agrpo.services.common.config import ConfigError, load_config

    try:
        cfg = load_config(argv)
    except ConfigError as exc:
        print(f"agrpo {name}: config error: {exc}", file=sys.stderr)
        return 2
    from agrpo.services.common.imports import adopt_sys_path
    from agrpo.services.common.preflight import STARTUP_ERROR_EXIT, StartupError

    adopt_sys_path(cfg.sys_path)  # user code resolves as in a spawned child of the user's script

    module = cast(ServiceModule, importlib.import_module(module_name))
    try:
        module.preflight(cfg)
        return int(module.main(cfg) or 0)
    except StartupError as exc:
        print(f"agrpo {name}: {exc}", file=sys.stderr)
        return STARTUP_ERROR_EXIT
