"""One structured logger for every service: JSON lines in containers, text on a TTY.

Fields: timestamp, severity, service, message, plus any `extra={...}` given
(policy_version, step, request_id, ...).
"""

from __future__ import annotations

import json
import logging
import sys
import time

_SERVICE = "agrpo"
_STD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "severity": record.levelname,
            "service": _SERVICE,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STD_ATTRS})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STD_ATTRS)
        line = (f"{time.strftime('%H:%M:%S', time.localtime(record.created))} "
                f"{record.levelname[0]} {_SERVICE} {record.getMessage()}")
        if extras:
            line += f"  [{extras}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(service: str, fmt: str = "auto", level: str = "info") -> logging.Logger:
    """Route every `agrpo.*` logger to stderr in the chosen format; return the service logger."""
    global _SERVICE
    _SERVICE = service
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if use_json else _TextFormatter())
    root = logging.getLogger("agrpo")
    root.handlers[:] = [handler]
    root.setLevel("INFO" if level == "passive" else level.upper())
    root.propagate = False
    return get_logger(service)


def get_logger(name: str) -> logging.Logger:
    """A logger under the shared `agrpo` root."""
    return logging.getLogger(f"agrpo.{name}")
