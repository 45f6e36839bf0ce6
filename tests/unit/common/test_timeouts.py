"""services/common/timeouts.py: every fixed wait is named, documented and read by its call sites."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from agrpo.services.common import timeouts

ROOT = Path(__file__).resolve().parents[3]
MODULE = ROOT / "services" / "common" / "timeouts.py"


def _constants() -> dict[str, str | None]:
    """Each module-level constant -> the docstring right under it (None when there is none)."""
    body = ast.parse(MODULE.read_text()).body
    out: dict[str, str | None] = {}
    for stmt, after in zip(body, [*body[1:], None], strict=True):
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else None
            out[stmt.targets[0].id] = doc
    return out


def test_every_constant_is_a_positive_number_with_a_one_line_docstring():
    consts = _constants()
    assert len(consts) >= 8
    for name, doc in consts.items():
        assert name.isupper() and name.endswith("_S"), name
        value = getattr(timeouts, name)
        assert isinstance(value, float) and value > 0, name
        assert doc and "\n" not in doc.strip(), f"{name} needs a one-line docstring"


def test_every_constant_is_imported_by_a_call_site():
    """A constant no module imports is dead, or its call site went back to a literal."""
    used: set[str] = set()
    files = [*(ROOT / "services").rglob("*.py"),
             *(p for p in (ROOT / "agrpo").rglob("*.py") if p.parts[len(ROOT.parts) + 1] not in ("services", "v1"))]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "agrpo.services.common.timeouts":
                used.update(alias.name for alias in node.names)
    assert set(_constants()) - used == set()


def test_call_sites_default_to_the_constants():
    from agrpo.services.reward import builtins
    from agrpo.services.rollout.vllm_client import VLLMClient
    from agrpo.services.trainer.server import TrainerService

    assert builtins.ITEM_TIMEOUT_S is timeouts.ITEM_TIMEOUT_S
    assert builtins.Accuracy().item_timeout_s == timeouts.ITEM_TIMEOUT_S
    watch = inspect.signature(TrainerService._watch_ranks).parameters
    assert (watch["every_s"].default, watch["silent_s"].default) == \
        (timeouts.RANK_WATCH_PERIOD_S, timeouts.RANK_SILENT_S)
    assert inspect.signature(VLLMClient._get).parameters["timeout"].default == timeouts.VLLM_GET_TIMEOUT_S
    assert inspect.signature(VLLMClient.healthy).parameters["timeout"].default == timeouts.VLLM_HEALTH_TIMEOUT_S


async def test_weight_label_call_waits_the_named_timeout(monkeypatch):
    """Rollout's GET /weight_info is bounded by WEIGHT_LABEL_TIMEOUT_S as its module reads it."""
    from agrpo.services.rollout import vllm_client

    seen = {}

    class Session:
        def get(self, url, timeout):
            seen["url"], seen["total"] = url, timeout.total
            raise vllm_client.aiohttp.ClientConnectionError("no server")

    monkeypatch.setattr(vllm_client, "WEIGHT_LABEL_TIMEOUT_S", 1.25)
    client = vllm_client.VLLMClient("http://vllm", Session(), request_timeout=60.0)
    assert await client.weight_label() is None
    assert seen == {"url": "http://vllm/weight_info", "total": 1.25}


@pytest.mark.parametrize("module", ["agrpo.services.trainer.publisher", "agrpo.launcher.processes",
                                    "agrpo.launcher.job", "agrpo.services.rollout.app"])
def test_call_site_modules_hold_the_constants_themselves(module):
    import importlib

    mod = importlib.import_module(module)
    names = {n for n in dir(mod) if n in _constants()}
    assert names, f"{module} reads no constant of services/common/timeouts.py"
    assert all(getattr(mod, n) is getattr(timeouts, n) for n in names)
