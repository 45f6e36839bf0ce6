"""Weight sync into vLLM servers through vLLM's RL API (pause -> start -> update ->
finish(version label) -> reset prefix cache -> resume), with HTTP, shared-path and
NCCL transports. See orchestrator.py for the flow and its failure rules."""

from .client import VLLMAdmin, WeightSyncError
from .orchestrator import SyncReport, WeightSyncer

__all__ = ["SyncReport", "VLLMAdmin", "WeightSyncError", "WeightSyncer"]
