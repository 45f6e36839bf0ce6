"""Prometheus metrics: one naming rule and one /metrics endpoint per service.

Names follow `agrpo_<service>_<what>_<unit>`; `Metrics("trainer").counter("steps", ...)`
registers `agrpo_trainer_steps_total`.
"""

from __future__ import annotations

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
