"""The reward service: scores completions with reward functions over gRPC (RewardService).

What other packages may use (the launcher's preflight): `check_reward_names`. Everything else is the
service's own.
"""

from .registry import check_names as check_reward_names

__all__ = ["check_reward_names"]
