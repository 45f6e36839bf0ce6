"""Wait for a gRPC server to report SERVING: one poll loop for the demo and the tests."""

from __future__ import annotations

import time
from collections.abc import Callable

from agrpo.services.common.timeouts import HEALTH_CHECK_TIMEOUT_S


def wait_serving(address: str, service: str = "", timeout_s: float = 90.0,
                 check_alive: Callable[[], None] = lambda: None, interval_s: float = 0.25) -> bool:
    """Poll grpc.health.v1 until `service` is SERVING (True) or `timeout_s` passes (False).

    `check_alive` runs before each poll and should raise when the server process died,
    so a crash is reported at once rather than as a timeout."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            check_alive()
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=HEALTH_CHECK_TIMEOUT_S).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(interval_s)
    return False
