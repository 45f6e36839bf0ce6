"""Weight sync into vLLM servers through vLLM's RL API, with HTTP, shared-path and NCCL
transports. vLLM's flow: pause(keep) -> start -> update -> finish(version label) -> resume
(/pause resets the prefix cache itself); our worker extension's direct load: pause the
scheduler -> update -> reset prefix cache -> label -> resume. See orchestrator.py for
both flows and their failure rules."""

from .client import VLLMAdmin, WeightSyncError
from .orchestrator import SyncReport, WeightSyncer

__all__ = ["SyncReport", "VLLMAdmin", "WeightSyncError", "WeightSyncer"]
