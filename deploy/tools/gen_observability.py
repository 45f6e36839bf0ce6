"""Write (or --check) docs/metrics.md and the Grafana dashboard from the code.

    .venv/bin/python deploy/tools/gen_observability.py          # regenerate both
    .venv/bin/python deploy/tools/gen_observability.py --check  # exit 1 on drift

--check also fails when the dashboard or deploy/prometheus/rules.yml reads a series
that no service registers (a renamed metric would otherwise show an empty panel).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(Path(__file__).resolve().parent)]

import yaml  # noqa: E402

import dashboard  # noqa: E402
import metrics_catalog as catalog  # noqa: E402

DOCS = ROOT / "docs" / "metrics.md"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "agrpo.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"


def rule_exprs(path: Path) -> tuple[list[str], set[str]]:
    """Expressions of the rules file and the names its recording rules define."""
    groups = yaml.safe_load(path.read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    return [r["expr"] for r in rules], {r["record"] for r in rules if "record" in r}


def unknown_series(exprs: list[str], known: set[str]) -> list[str]:
    """Series the expressions read that nothing exposes."""
    return sorted({n for e in exprs for n in catalog.names_in_expr(e)} - known)


def outputs() -> dict[Path, str]:
    metrics = catalog.all_metrics()
    return {DOCS: catalog.render_markdown(metrics),
            DASHBOARD: json.dumps(dashboard.build(), indent=2) + "\n"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    problems = []
    for path, text in outputs().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                problems.append(f"{path.relative_to(ROOT)} is out of date: run deploy/tools/gen_observability.py")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    known = catalog.known_names(catalog.all_metrics()) | {"up"}
    rule_e, recorded = rule_exprs(RULES)
    for where, exprs in (("dashboard", dashboard.exprs(dashboard.build())), ("rules.yml", rule_e)):
        missing = unknown_series(exprs, known | recorded)
        if missing:
            problems.append(f"{where} reads series no service exposes: {', '.join(missing)}")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
