"""The trainer service: GRPO learner that syncs weights into vLLM and publishes policy versions.

What other packages may use (the launcher, the Python API): `latest_checkpoint`. Everything else
is the service's own.
"""

from .checkpoint import latest as latest_checkpoint

__all__ = ["latest_checkpoint"]
