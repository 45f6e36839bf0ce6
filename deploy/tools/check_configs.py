"""Check that every deployed agrpo container starts with a config that loads and fits.

For each agrpo container in the rendered compose files (`docker compose config
--format json`) and Kubernetes overlays (`kubectl kustomize`), rebuild what the
service would load at start (deploy/config/agrpo.yaml < AGRPO_* env < flags) with the
project's own loader, then check it against the manifest: the gRPC and metrics ports
are the ones exposed/probed, the peers' addresses and the vLLM URL name services that
exist. A typo in a flag or a port mismatch fails here, not on a cluster.

    python check_configs.py --config deploy/config/agrpo.yaml \
        --compose gpu.json --compose cpu.json --k8s gpu.yaml --k8s cpu-dev.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from urllib.parse import urlparse

import yaml

from agrpo.services.common.config import ConfigError, load_config

SERVICES = ("trainer", "rollout", "reward")
IN_CONTAINER = "/etc/agrpo/agrpo.yaml"


def resolve(args: list[str], env: dict[str, str], config_file: Path):
    """(service, config) a container's `agrpo <service> ...` command would load."""
    service, rest = args[0], [str(config_file) if a == IN_CONTAINER else a for a in args[1:]]
    env = {k: str(v) for k, v in env.items() if k.startswith("AGRPO_") and k != "AGRPO_CONFIG"}
    return service, load_config(rest, env)


def check_one(where: str, service: str, cfg, ports: set[int], names: set[str]) -> list[str]:
    """Mismatches between a service's config and its manifest."""
    out = []
    section = getattr(cfg, service)
    if section.host != "0.0.0.0":
        out.append(f"{where}: {service}.host is {section.host}; peers cannot reach it")
    for key in ("port", "metrics_port"):
        if getattr(section, key) not in ports:
            out.append(f"{where}: {service}.{key}={getattr(section, key)} is not exposed ({sorted(ports)})")
    for peer in SERVICES:
        host = getattr(cfg, peer).dial_address.rsplit(":", 1)[0]
        if host not in names:
            out.append(f"{where}: {peer}.address host {host!r} names no service")
    for url in cfg.vllm_urls:
        if urlparse(url).hostname not in names:
            out.append(f"{where}: vLLM URL {url} names no service")
    return out


def compose_containers(path: Path):
    """One dict per agrpo service of a rendered compose file."""
    doc = json.loads(path.read_text())
    for name, svc in doc["services"].items():
        cmd = svc.get("command") or []
        if cmd and cmd[0] in SERVICES:
            yield {"where": f"{path.name}:{name}", "args": cmd, "env": svc.get("environment") or {},
                   "ports": {int(p) for p in svc.get("expose", [])}, "probes": set(),
                   "names": set(doc["services"])}


def k8s_containers(path: Path):
    """One dict per agrpo container of a rendered kustomize overlay."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    names = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    for d in docs:
        if d["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            args = c.get("args") or []
            if args and args[0] in SERVICES:
                yield {"where": f"{path.name}:{d['kind']}/{d['metadata']['name']}", "args": args,
                       "env": {e["name"]: e.get("value", "") for e in c.get("env", [])},
                       "ports": {p["containerPort"] for p in c.get("ports", [])},
                       "probes": {c[p]["grpc"]["port"] for p in ("startupProbe", "readinessProbe", "livenessProbe")
                                  if "grpc" in c.get(p, {})},
                       "names": names}


def check_container(c: dict, config_file: Path) -> list[str]:
    """Problems of one container: config errors, port and name mismatches."""
    try:
        service, cfg = resolve(c["args"], c["env"], config_file)
    except ConfigError as exc:
        return [f"{c['where']}: config error: {exc}"]
    out = check_one(c["where"], service, cfg, c["ports"], c["names"])
    port = getattr(cfg, service).port
    if c["probes"] and c["probes"] != {port}:
        out.append(f"{c['where']}: gRPC probes hit {sorted(c['probes'])}, {service}.port is {port}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--compose", type=Path, action="append", default=[])
    parser.add_argument("--k8s", type=Path, action="append", default=[])
    args = parser.parse_args(argv)
    containers = [c for p in args.compose for c in compose_containers(p)]
    containers += [c for p in args.k8s for c in k8s_containers(p)]
    problems = [p for c in containers for p in check_container(c, args.config)]
    for p in problems:
        print(p, file=sys.stderr)
    print(f"checked {len(containers)} agrpo containers: {len(problems)} problem(s)")
    return 1 if problems or not containers else 0


if __name__ == "__main__":
    sys.exit(main())
