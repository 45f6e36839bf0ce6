"""Start-up checks that turn a user's mistake into one line naming the config key.

Each service runs the checks for what it uses before it starts (and `agrpo run` runs them
all before it starts anything): its ports are free, the model folder and the data files
exist, vLLM URLs are base URLs. A failed check raises StartupError; the entry point prints
its message on one line and exits with status 2 (a supervisor does not restart that).
"""

from __future__ import annotations

import glob
import socket
from pathlib import Path
from urllib.parse import urlparse

STARTUP_ERROR_EXIT = 2
INTERRUPTED_EXIT = 130
"""The exit status of a process stopped by Ctrl-C or SIGTERM (a shell's 128 + SIGINT)."""
BUILDERS = {"json", "csv", "parquet", "text", "arrow", "webdataset", "imagefolder", "audiofolder"}


class StartupError(Exception):
    """A configuration that cannot start; the message is one line naming the key."""


def check_port(host: str, port: int | None, key: str) -> None:
    """`port` can be bound on `host` (0 and None are always fine)."""
    if not port:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise StartupError(f"{key}={port}: cannot listen on {host}:{port} ({exc.strerror}; "
                               "another process holds it?)") from None


def check_service_ports(cfg, name: str) -> None:
    section = getattr(cfg, name)
    check_port(section.host, section.port, f"{name}.port")
    check_port(section.host, section.metrics_port, f"{name}.metrics_port")


def check_model(cfg) -> None:
    """`model` is set and, when it looks like a path, exists (agrpo loads from folders)."""
    if not cfg.model:
        raise StartupError("model is not set: give a model folder (config key `model`)")
    path = Path(cfg.model).expanduser()
    looks_local = cfg.model.startswith((".", "/", "~")) or cfg.model.count("/") != 1
    if looks_local and not path.is_dir():
        raise StartupError(f"model={cfg.model!r}: no such folder (config key `model`: a folder with "
                           "config.json and the weights, or a hub id in the form org/name)")


def check_dataset(cfg, config_dir: Path | None = None) -> None:
    """The dataset's local folder or data files exist. Relative paths are from the current
    folder, as `datasets.load_dataset` reads them; `config_dir` (agrpo run's config file's folder)
    only names where a missing file was found instead."""
    ds = cfg.dataset
    if ds.path is None:
        return
    files = ds.data_files
    if files is None:
        if ds.path not in BUILDERS and ds.path.startswith((".", "/", "~")) and not Path(ds.path).expanduser().exists():
            raise StartupError(f"dataset.path={ds.path!r}: no such folder or file")
        return
    names = [files] if isinstance(files, str) else list(files) if isinstance(files, list) else \
        [f for v in files.values() for f in ([v] if isinstance(v, str) else v)]
    for name in names:
        if "://" in name:
            continue
        if not glob.glob(str(Path(name).expanduser())):
            beside = config_dir / name if config_dir is not None and not Path(name).is_absolute() else None
            hint = (f" in {Path.cwd()} (paths are from the current folder; it is beside the config file: "
                    f"{beside})") if beside is not None and glob.glob(str(beside)) else ""
            raise StartupError(f"dataset.data_files: {name!r} does not exist{hint}")


def check_vllm_urls(cfg) -> None:
    """Each vLLM URL is a server's base URL (http(s)://host:port, no /v1)."""
    key = "vllm_server_base_urls" if cfg.vllm_server_base_urls else "vllm_server_base_url"
    for url in cfg.vllm_urls:
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise StartupError(f"{key}={url!r} is not an http(s) URL (e.g. http://localhost:8000)")
        if parsed.path.rstrip("/").endswith("/v1"):
            raise StartupError(f"{key}={url!r}: give the server's base URL without /v1 "
                               f"(e.g. {parsed.scheme}://{parsed.netloc})")
