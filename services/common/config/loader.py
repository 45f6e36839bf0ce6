"""Build the config from defaults < YAML file < environment < command-line flags.

- File: `--config FILE` or `AGRPO_CONFIG`; YAML (JSON is YAML too).
- Environment: `AGRPO_<KEY>` for a top-level key, `AGRPO_<SECTION>__<KEY>` inside a
  section (e.g. `AGRPO_MAX_STALENESS=2`, `AGRPO_TRAINER__PORT=0`).
- Flags: `--key value` or `--key=value`, dotted for sections (`--trainer.port 0`);
  dashes and underscores are interchangeable.
Values from the environment and flags are parsed as YAML scalars ("2" -> 2, "[a, b]" -> list).
"""

from __future__ import annotations

import copy
import difflib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .compat import check_unsupported
from .model import AgrpoConfig

ENV_PREFIX = "AGRPO_"
# AGRPO_* variables that are not config keys: the config file, and where the launchers
# (demo, tests) find vLLM's interpreter.
NOT_KEYS = frozenset({"AGRPO_CONFIG", "AGRPO_VLLM_PYTHON"})


class ConfigError(ValueError):
    """A config that cannot be used; the message names the key and what is allowed."""


def load_config(argv: Sequence[str] = (), env: Mapping[str, str] | None = None) -> AgrpoConfig:
    """Resolve and validate the config; raise ConfigError with one line per problem."""
    env = os.environ if env is None else env
    flags, config_file = _parse_flags(argv)
    config_file = config_file or env.get(ENV_PREFIX + "CONFIG")
    sources = [(f"config file {config_file}", _read_file(Path(config_file)) if config_file else {}),
               ("environment", _from_env(env)), ("command line", flags)]
    raw: dict[str, Any] = {}
    for _, part in sources:
        merge(raw, part)
    raw, errors = check_unsupported(raw)
    if errors:
        raise ConfigError("; ".join(errors))
    try:
        return AgrpoConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, sources)) from None


def _source_of(loc: tuple, sources) -> str:
    """Where a key path came from: the config file, an AGRPO_* variable or a flag."""
    for name, part in reversed(sources):
        node = part
        for p in loc:
            node = node.get(p) if isinstance(node, dict) else None
            if node is None:
                break
        else:
            if name == "environment":
                return f"from the environment, {ENV_PREFIX}{'__'.join(str(p).upper() for p in loc)}"
            if name == "command line":
                return f"from the command line, --{'.'.join(str(p) for p in loc)}"
            return f"from the {name}"
    return ""


def _suggestion(loc: tuple) -> str:
    """The closest valid key at the same level, if one is close."""
    model: Any = AgrpoConfig
    for p in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(p)
        model = getattr(field, "annotation", None)
    names = list(getattr(model, "model_fields", {}))
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.75)
    return f"; did you mean {'.'.join([*map(str, loc[:-1]), close[0]])}?" if close else ""


def format_validation_error(exc: ValidationError, sources=()) -> str:
    """One short clause per error: `key.path: what is wrong (got value)`; unknown keys name
    where they came from and the closest valid key."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            where = _source_of(tuple(err["loc"]), sources)
            parts.append(f"{loc}: unknown key{f' ({where})' if where else ''}{_suggestion(tuple(err['loc']))}")
        elif not err["loc"]:
            parts.append(msg)
        else:
            parts.append(f"{loc}: {msg} (got {err.get('input')!r})")
    return "; ".join(parts)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: invalid YAML: {exc}".replace("\n", " ")) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of keys, got {type(data).__name__}")
    return data


def _scalar(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name in NOT_KEYS:
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX):].split("__")]
        _set_path(out, path, _scalar(value))
    return out


def _parse_flags(argv: Sequence[str]) -> tuple[dict[str, Any], str | None]:
    out: dict[str, Any] = {}
    config_file = None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(f"unexpected argument {arg!r}: flags look like --key value")
        key, sep, value = arg[2:].partition("=")
        if not sep:
            if not args or args[0].startswith("--"):
                raise ConfigError(f"--{key}: missing value")
            value = args.pop(0)
        key = key.replace("-", "_")
        if key == "config":
            config_file = value
            continue
        _set_path(out, key.split("."), _scalar(value))
    return out, config_file


def _set_path(out: dict[str, Any], path: list[str], value: Any) -> None:
    node = out
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{'.'.join(path)}: {part} is not a section")
    node[path[-1]] = value


def merge(base: dict[str, Any], override: dict[str, Any]) -> None:
    """Nested sections merge key by key; anything else replaces, as a copy: a later merge into
    `base` must not change `override` (benchmarks/async_speedup.py merges its --set into every
    run, then a variant on top: the variant used to leak into --set and so into later runs)."""
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
