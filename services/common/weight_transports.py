"""Weight transports by name: the one registration a new transport needs.

A transport is one module with one `WeightTransport` subclass
(services/trainer/weight_sync/base.py) and one line here. The config's choices for
`trainer.weight_transport`, the contract's enum value (`WEIGHT_TRANSPORT_<NAME>` in
protos/agrpo/v1/common.proto, which a new transport adds) and the trainer's factory all read
this table, so nothing else lists them. No heavy import: the config loads it.
"""

from __future__ import annotations

import importlib

TRANSPORTS: dict[str, str] = {
    "http": "agrpo.services.trainer.weight_sync.transports:HttpTransport",
    "shared_path": "agrpo.services.trainer.weight_sync.transports:SharedPathTransport",
    "nccl": "agrpo.services.trainer.weight_sync.nccl:NcclTransport",
    "ipc": "agrpo.services.trainer.weight_sync.ipc:IpcTransport",
    "local": "agrpo.services.trainer.weight_sync.local:LocalTransport",
}
NAMES: tuple[str, ...] = tuple(TRANSPORTS)


def proto_name(name: str) -> str:
    """The contract's enum name for a transport (WeightTransport in common.proto)."""
    return f"WEIGHT_TRANSPORT_{name.upper()}"


def load(name: str) -> type:
    """The transport class registered under `name` (imports its module)."""
    module, _, attr = TRANSPORTS[name].partition(":")
    return getattr(importlib.import_module(module), attr)
