"""The current policy version and its watchers (WatchPolicy streams).

Each watcher gets the current version at once, then every new one. A slow watcher
only ever needs the newest version, so its queue keeps just the latest message.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from agrpo.services.common.versions import Lineage


@dataclass(frozen=True)
class PolicyInfo:
    """A published policy version (mirrors agrpo.v1.PolicyVersion)."""

    version: int
    step: int
    weight_label: str
    transport: str
    weights_uri: str = ""
    synced_servers: tuple[str, ...] = ()
    lineage: Lineage = field(default_factory=Lineage)
    lora_adapter: str = ""
    """The vLLM adapter serving this version (adapter-only LoRA sync); "" for full weights."""


class PolicyBoard:
    """Holds the current PolicyInfo and fans new ones out to subscribers."""

    def __init__(self) -> None:
        self.current: PolicyInfo | None = None
        self._watchers: set[asyncio.Queue] = set()

    def publish(self, version: int, step: int, synced: list[str], transport: str, uri: str = "",
                lineage: Lineage | None = None, lora_adapter: str = "") -> PolicyInfo:
        info = PolicyInfo(version, step, str(version), transport, uri, tuple(synced), lineage or Lineage(),
                          lora_adapter)
        self.current = info
        for q in self._watchers:
            while not q.empty():
                q.get_nowait()
            q.put_nowait(info)
        return info

    def subscribe(self) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        if self.current is not None:
            q.put_nowait(self.current)
        self._watchers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue) -> None:
        self._watchers.discard(q)

    def close(self) -> None:
        """Wake every watcher with None (server stopping)."""
        for q in self._watchers:
            q.put_nowait(None)
