"""services/common/entry.py: one service from its command line, and services/ never imports the `agrpo` command."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

from agrpo.services.common import entry
from agrpo.services.common.preflight import STARTUP_ERROR_EXIT, StartupError

SERVICES_DIR = Path(__file__).resolve().parents[3] / "services"


def _fake_service(monkeypatch, preflight_error: str | None = None, status: int = 0) -> list[str]:
    """A ServiceModule registered as service "fake"; returns the calls it saw."""
    calls: list[str] = []
    module = types.ModuleType("fake_service_for_entry")

    def preflight(cfg) -> None:
        calls.append("preflight")
        if preflight_error:
            raise StartupError(preflight_error)

    def main(cfg) -> int:
        calls.append("main")
        return status

    module.preflight, module.main = preflight, main
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(entry.SERVICES, "fake", (module.__name__, "A fake service."))
    return calls


def test_a_service_runs_after_its_preflight(monkeypatch):
    calls = _fake_service(monkeypatch, status=3)
    assert entry.run_service("fake", []) == 3 and calls == ["preflight", "main"]


def test_a_startup_error_is_one_line_and_its_exit_status(monkeypatch, capsys):
    calls = _fake_service(monkeypatch, preflight_error="model=x cannot be loaded")
    assert entry.run_service("fake", []) == STARTUP_ERROR_EXIT and calls == ["preflight"]
    assert capsys.readouterr().err == "agrpo fake: model=x cannot be loaded\n"


def test_a_config_error_exits_2_naming_the_key(monkeypatch, capsys):
    calls = _fake_service(monkeypatch)
    assert entry.run_service("fake", ["--max_staleness", "-1"]) == 2 and calls == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config error" in err[0] and "max_staleness" in err[0]


def test_help_without_loading_the_config(monkeypatch, capsys):
    calls = _fake_service(monkeypatch)
    assert entry.run_service("fake", ["--help"]) == 0 and calls == []
    assert capsys.readouterr().out.startswith("agrpo fake: A fake service.\n\nusage: agrpo fake ")


def test_services_never_import_the_agrpo_command():
    """agrpo/cli.py (and the launcher, the demo) import services; services importing them back
    would be a cycle between the folders."""
    offenders = []
    for path in SERVICES_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "agrpo.cli" or n.startswith(("agrpo.cli.", "agrpo.launcher", "agrpo.demo")) for n in names):
                offenders.append(str(path.relative_to(SERVICES_DIR)))
    assert not offenders, offenders
