"""Offline checks of the service Dockerfiles (no Docker daemon needed).

Parses each Dockerfile with BuildKit's own parser (PyPI `dockerfile`) and enforces
the image rules of deploy/README.md: base image as a build argument, multi-stage,
a non-root final USER, a HEALTHCHECK, and a .dockerignore next to it.

    python check_dockerfiles.py deploy/docker/*.Dockerfile
"""

from __future__ import annotations

import sys
from pathlib import Path

import dockerfile


def problems_of(path: Path) -> list[str]:
    """Rule violations of one Dockerfile (empty: fine)."""
    try:
        cmds = dockerfile.parse_file(str(path))
    except dockerfile.GoParseError as exc:
        return [f"parse error: {exc}"]
    out = []
    froms = [c for c in cmds if c.cmd == "FROM"]
    first_from = cmds.index(froms[0]) if froms else len(cmds)
    pre_args = [c.value[0].split("=")[0] for c in cmds[:first_from] if c.cmd == "ARG"]
    if "BASE_IMAGE" not in pre_args:
        out.append("no `ARG BASE_IMAGE` before the first FROM")
    if any("${BASE_IMAGE}" not in c.value[0] for c in froms):
        out.append("every stage must start FROM ${BASE_IMAGE}")
    if len(froms) < 2:
        out.append("not multi-stage (one FROM)")
    final = cmds[cmds.index(froms[-1]):] if froms else cmds
    users = [c.value[0] for c in final if c.cmd == "USER"]
    if not users or users[-1].split(":")[0] in ("0", "root"):
        out.append("the final stage must switch to a non-root USER")
    if not any(c.cmd == "HEALTHCHECK" and c.value[0] != "NONE" for c in final):
        out.append("no HEALTHCHECK in the final stage")
    if not path.with_name(path.name + ".dockerignore").exists():
        out.append(f"missing {path.name}.dockerignore (the context is the whole repository)")
    return out


def main(argv: list[str]) -> int:
    failed = 0
    for name in argv:
        problems = problems_of(Path(name))
        for p in problems:
            print(f"{name}: {p}", file=sys.stderr)
        failed += bool(problems)
        if not problems:
            print(f"{name}: ok")
    return 1 if failed or not argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
