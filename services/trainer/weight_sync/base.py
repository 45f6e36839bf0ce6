"""The weight-transport seam: how a published version's tensors reach the inference servers.

`prepare` (blocking, in a thread) builds a version's payload once; `send` replays it to any
number of servers inside the orchestrator's update phase. What a transport can do is declared
on its class, and the orchestrator and the loop read those attributes (nothing is probed).
A new transport is a module with a subclass and one line in services/common/weight_transports.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from .client import VLLMAdmin


@dataclass
class Prepared:
    """A version's payload: update_info dicts for /update_weights, plus where it lives."""

    version: int
    update_infos: list[dict[str, Any]]
    uri: str = ""
    nbytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class WeightTransport(ABC):
    """One way of moving weights into the servers."""

    name: ClassVar[str]
    snapshot: ClassVar[bool] = True
    """prepare() copies the weights: training may change them once it returns (False: the
    transport sends the live parameters, so the next step waits for the push)."""
    in_band: ClassVar[bool] = False
    """The payload travels in the update request, so the engine's one-call swap can carry it."""
    direct_only: ClassVar[bool] = False
    """Only our worker extension loads it (no vLLM load flow)."""
    needs_gpu: ClassVar[bool] = False
    """The trainer must train on a GPU."""
    carries_adapters: ClassVar[bool] = False
    """Our worker extension can stage a LoRA adapter from prepare()'s payload (adapter_sync.py);
    else an adapter travels inline in the stage request."""

    @classmethod
    @abstractmethod
    def from_config(cls, cfg, device: torch.device) -> WeightTransport:
        """The transport as the config asks for it."""

    async def init(self, admin: VLLMAdmin) -> None:  # noqa: B027 - a no-op unless the transport needs it
        """Set a server up for this transport (first time, or after a failure)."""

    @abstractmethod
    def prepare(self, named: list[tuple[str, torch.Tensor]], version: int) -> Prepared:
        """A version's payload, built once for every server."""

    @abstractmethod
    async def send(self, admin: VLLMAdmin, prepared: Prepared) -> None:
        """Replay the payload to one server (the update phase)."""

    def close(self) -> None:  # noqa: B027 - a no-op unless the transport holds something
        """Release what the transport holds (buffers, communicators)."""
