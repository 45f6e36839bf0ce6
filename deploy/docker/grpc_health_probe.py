"""Container health check through the standard gRPC health service.

Exits 0 when the service answers SERVING, 1 otherwise (NOT_SERVING, unreachable,
timeout). Docker's HEALTHCHECK runs it; Kubernetes uses its native `grpc:` probes, which
speak plaintext only: with `tls.enabled` use this script as an `exec:` probe instead,
with `--ca` (TLS) plus `--cert`/`--key` (mTLS, a client certificate the server trusts).
Health needs no bearer token.

    python grpc_health_probe.py 127.0.0.1:50051 [--service NAME] [--timeout 3]
    python grpc_health_probe.py localhost:50053 --ca ca.pem [--cert c.pem --key c.key] \
        [--server-name reward]
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _channel(address: str, ca: str | None, cert: str | None, key: str | None,
             server_name: str | None) -> grpc.Channel:
    """Plaintext, or TLS when `ca` is given (presenting cert/key for mTLS)."""
    if ca is None:
        return grpc.insecure_channel(address)
    def read(path: str | None) -> bytes | None:
        return None if path is None else open(path, "rb").read()
    creds = grpc.ssl_channel_credentials(read(ca), read(key), read(cert))
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return grpc.secure_channel(address, creds, options=options)


def check(address: str, service: str = "", timeout: float = 3.0, ca: str | None = None,
          cert: str | None = None, key: str | None = None, server_name: str | None = None) -> bool:
    """True when `service` ("" = the whole server) reports SERVING at `address`."""
    with _channel(address, ca, cert, key, server_name) as channel:
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
    parser.add_argument("--ca", help="PEM CA bundle: dial with TLS, verifying the server")
    parser.add_argument("--cert", help="PEM client certificate, for mTLS (with --key)")
    parser.add_argument("--key", help="PEM key of --cert")
    parser.add_argument("--server-name", help="expected server name, when it differs from the host")
    args = parser.parse_args(argv)
    if (args.cert is None) != (args.key is None) or (args.cert and not args.ca):
        parser.error("--cert and --key go together, and need --ca")
    ok = check(args.address, args.service, args.timeout, args.ca, args.cert, args.key,
               args.server_name)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
