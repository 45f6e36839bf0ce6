"""Container health check through the standard gRPC health service.

Exits 0 when the service answers SERVING, 1 otherwise (NOT_SERVING, unreachable,
timeout). Docker's HEALTHCHECK runs it; Kubernetes uses its native `grpc:` probes.

    python grpc_health_probe.py 127.0.0.1:50051 [--service NAME] [--timeout 3]
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str = "", timeout: float = 3.0) -> bool:
    """True when `service` ("" = the whole server) reports SERVING at `address`."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            print(f"{address}: {exc.code().name}", file=sys.stderr)
            return False
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"{address}: {status}", file=sys.stderr)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="host:port of the gRPC server")
    parser.add_argument("--service", default="", help="health service name; empty: the server")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds for the Check call")
    args = parser.parse_args(argv)
    return 0 if check(args.address, args.service, args.timeout) else 1


if __name__ == "__main__":
    sys.exit(main())
