"""Prometheus metrics: one naming rule and one /metrics endpoint per service.

Names follow `agrpo_<service>_<what>_<unit>`; `Metrics("trainer").counter("steps", ...)`
registers `agrpo_trainer_steps_total`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """Factory of metrics under one service prefix, in a registry of its own."""

    def __init__(self, service: str, registry: CollectorRegistry | None = None) -> None:
        self.prefix = f"agrpo_{service}"
        self.registry = registry or CollectorRegistry()

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        """A counter named `<prefix>_<name>_total`."""
        return Counter(f"{self.prefix}_{name}", doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
        """A gauge named `<prefix>_<name>`."""
        return Gauge(f"{self.prefix}_{name}", doc, labels, registry=self.registry)

    def histogram(self, name: str, doc: str, labels: tuple[str, ...] = (),
                  buckets: tuple[float, ...] = LATENCY_BUCKETS) -> Histogram:
        """A histogram named `<prefix>_<name>`."""
        return Histogram(f"{self.prefix}_{name}", doc, labels, buckets=buckets, registry=self.registry)

    def serve(self, port: int | None, host: str = "0.0.0.0") -> int | None:
        """Expose /metrics on a side HTTP port; return the bound port (None when disabled)."""
        if port is None:
            return None
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server.server_port


class IdleClock:
    """Time spent idle (nothing to do) versus busy, for idle-fraction metrics.

    `busy(True/False)` marks transitions; `idle_s` and `total_s` include the interval in
    progress. The clock starts at `start()` (before it, nothing is counted).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._t0: float | None = None
        self._idle_since: float | None = None
        self._idle = 0.0

    def start(self, busy: bool = False) -> None:
        if self._t0 is None:
            self._t0 = self.clock()
            self._idle_since = None if busy else self._t0

    def busy(self, is_busy: bool) -> None:
        if self._t0 is None:
            return
        now = self.clock()
        if is_busy and self._idle_since is not None:
            self._idle += now - self._idle_since
            self._idle_since = None
        elif not is_busy and self._idle_since is None:
            self._idle_since = now

    @property
    def idle_s(self) -> float:
        if self._t0 is None:
            return 0.0
        running = self.clock() - self._idle_since if self._idle_since is not None else 0.0
        return self._idle + running

    @property
    def total_s(self) -> float:
        return 0.0 if self._t0 is None else self.clock() - self._t0
