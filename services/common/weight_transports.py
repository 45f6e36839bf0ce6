"""Weight transports by name: the one registration a new transport needs.

A transport is one module with one `WeightTransport` subclass
(services/trainer/weight_sync/base.py) and one line here. The config's choices for
`trainer.weight_transport`, the contract's enum value (`WEIGHT_TRANSPORT_<NAME>` in
protos/agrpo/v1/common.proto, which a new transport adds) and the trainer's factory all read
this table, so nothing else lists them. No heavy import: the config loads it.

Each registration also says which weight-sync keys of the trainer section (SYNC_KEYS) the
transport reads; a key it does not read, set explicitly to another value than its default
with the transport named, is a config error (AgrpoConfig._sync_keys_the_transport_reads), and
docs/config.md's knob table is this table.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Registration:
    """One transport: its class (`module:attr`, imported only by `load`) and the trainer keys it reads."""

    target: str
    keys: tuple[str, ...]


SYNC_KEYS: tuple[str, ...] = (
    "weight_load", "weight_swap", "cpu_reload", "sync_dtype", "overlap_weight_sync", "recompute_in_flight",
    "http_chunk_mb", "shared_weights_dir", "nccl_buffer_mb", "nccl_rendezvous", "nccl_master_address",
    "nccl_timeout_s")
"""The trainer's weight-sync keys besides weight_transport itself: each is read by the transports
that list it below (WeightSyncer, WeightPublisher and the transport's from_config), by no other."""

# Read by every transport that pushes into a vLLM server (WeightSyncer and the payload's dtype).
_INTO_VLLM = ("sync_dtype", "recompute_in_flight")
# http and shared_path: the payload is in the request (vLLM's one-call swap can carry it), our
# plugin's cpu_http engine reloads it, and prepare() snapshots (a push may overlap the next step).
_IN_BAND = ("weight_load", "weight_swap", "cpu_reload", "overlap_weight_sync")

TRANSPORTS: dict[str, Registration] = {
    "http": Registration("agrpo.services.trainer.weight_sync.transports:HttpTransport",
                         (*_INTO_VLLM, *_IN_BAND, "http_chunk_mb")),
    "shared_path": Registration("agrpo.services.trainer.weight_sync.transports:SharedPathTransport",
                                (*_INTO_VLLM, *_IN_BAND, "shared_weights_dir")),
    "nccl": Registration("agrpo.services.trainer.weight_sync.nccl:NcclTransport",
                         (*_INTO_VLLM, "weight_load", "nccl_buffer_mb", "nccl_rendezvous", "nccl_master_address",
                          "nccl_timeout_s")),
    # always a direct load (weight_load is moot), a snapshot into its shared buffer
    "ipc": Registration("agrpo.services.trainer.weight_sync.ipc:IpcTransport", (*_INTO_VLLM, "overlap_weight_sync")),
    # no vLLM: LocalSyncer copies the live weights into the trainer's own generator
    "local": Registration("agrpo.services.trainer.weight_sync.local:LocalTransport", ()),
}
NAMES: tuple[str, ...] = tuple(TRANSPORTS)


def reads(name: str) -> tuple[str, ...]:
    """The weight-sync keys transport `name` reads, in SYNC_KEYS order."""
    keys = set(TRANSPORTS[name].keys)
    return tuple(k for k in SYNC_KEYS if k in keys)


def proto_name(name: str) -> str:
    """The contract's enum name for a transport (WeightTransport in common.proto)."""
    return f"WEIGHT_TRANSPORT_{name.upper()}"


def load(name: str) -> type:
    """The transport class registered under `name` (imports its module)."""
    module, _, attr = TRANSPORTS[name].target.partition(":")
    return getattr(importlib.import_module(module), attr)
