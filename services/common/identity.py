"""Who this process is: the ServiceInfo every heartbeat and status carries."""

from __future__ import annotations

import time
import uuid

from google.protobuf.timestamp_pb2 import Timestamp

from agrpo import __version__
from agrpo.v1 import common_pb2


class Identity:
    """A service instance: its name, a fresh id per start, and its state."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.instance_id = f"{service}-{uuid.uuid4().hex[:12]}"
        self.started = time.monotonic()
        self.state = common_pb2.SERVING_STATE_STARTING

    def info(self) -> common_pb2.ServiceInfo:
        """The current ServiceInfo message."""
        return common_pb2.ServiceInfo(service=self.service, instance_id=self.instance_id,
                                      version=__version__, state=self.state,
                                      uptime_s=time.monotonic() - self.started)


def now_timestamp() -> Timestamp:
    """The current wall-clock time as a protobuf Timestamp."""
    ts = Timestamp()
    ts.GetCurrentTime()
    return ts
