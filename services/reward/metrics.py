"""Prometheus metrics of the reward service (`agrpo_reward_*`)."""

from __future__ import annotations

from agrpo.services.common.metrics import Metrics

from .results import Status


class RewardMetrics:
    """Requests, per-function latency/failures/timeouts, queue depth, in-flight, workers."""

    def __init__(self) -> None:
        m = self.metrics = Metrics("reward")
        self.registry = m.registry
        self.requests = m.counter("requests", "Calls by RPC and final status code, refused, "
                                  "cancelled and past-deadline ones included; ScoreStream: "
                                  "each request on a stream, and a stream ending in an error.",
                                  ("method", "code"))
        self.latency = m.histogram("function_latency_seconds",
                                   "Wall time of one reward-function call on one request.",
                                   ("function",))
        self.request_latency = m.histogram("request_latency_seconds",
                                           "Wall time of one Score request, queueing included.")
        self.failures = m.counter("function_failures", "Items a function failed on "
                                  "(raised, wrong length, non-finite, worker died).", ("function",))
        self.timeouts = m.counter("function_timeouts", "Calls of a function that ran past "
                                  "call_timeout_s.", ("function",))
        self.items = m.counter("items_scored", "Item scores by function and status.",
                               ("function", "status"))
        self.queue_depth = m.gauge("queue_depth", "Function calls waiting for a free worker.")
        self.in_flight = m.gauge("in_flight_requests", "Requests admitted and not yet answered.")
        self.busy_workers = m.gauge("busy_workers", "Worker processes running a call.")
        self.worker_restarts = m.counter("worker_restarts", "Worker processes replaced, by cause.",
                                         ("cause",))

    def on_pool_event(self, event: str, value: int) -> None:
        """Hook for WorkerPool: queue depth, busy workers and restarts."""
        if event == "queue_depth":
            self.queue_depth.set(value)
        elif event == "busy":
            self.busy_workers.set(value)
        elif event.startswith("restart_"):
            self.worker_restarts.labels(event.removeprefix("restart_")).inc(value)

    def record_call(self, name: str, status: str, elapsed_s: float,
                    item_statuses: list[Status]) -> None:
        """One function call on one request."""
        self.latency.labels(name).observe(elapsed_s)
        if status == "timeout":
            self.timeouts.labels(name).inc()
        failed = sum(1 for s in item_statuses if s is Status.FAILED)
        if failed:
            self.failures.labels(name).inc(failed)
        for status_ in set(item_statuses):
            self.items.labels(name, status_.name.lower()).inc(item_statuses.count(status_))

    def record_request(self, method: str, code: str) -> None:
        """One call (or stream request) ended with status `code`."""
        self.requests.labels(method, code).inc()

    def serve(self, port: int | None, host: str) -> int | None:
        """Expose /metrics on host:port (None: off), the interface gRPC listens on."""
        return self.metrics.serve(port, host)
