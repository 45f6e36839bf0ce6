"""RolloutService over gRPC: liveness and status; translation only."""

from __future__ import annotations

from agrpo.services.common.errors import grpc_errors
from agrpo.services.common.identity import now_timestamp
from agrpo.v1 import common_pb2
from agrpo.v1 import rollout_service_pb2_grpc as rollout_grpc


class RolloutServicer(rollout_grpc.RolloutServiceServicer):
    """Answers Heartbeat and GetStatus from the running RolloutApp."""

    def __init__(self, app) -> None:
        self.app = app

    @grpc_errors
    async def Heartbeat(self, request, context):
        return common_pb2.HeartbeatResponse(receiver=self.app.identity.info(),
                                            policy_version=self.app.version(), sent_at=now_timestamp())

    @grpc_errors
    async def GetStatus(self, request, context):
        status = self.app.status()
        servers = [common_pb2.InferenceServerStatus(**d) for d in status.pop("servers", [])]
        return common_pb2.GetStatusResponse(service=self.app.identity.info(),
                                            rollout=common_pb2.RolloutStatus(**status, servers=servers))
