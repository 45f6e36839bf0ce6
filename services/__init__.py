"""agrpo services: reward, rollout and trainer, plus the plumbing they share."""

__version__ = "0.1.0"
