"""agrpo's services: reward, rollout and trainer, plus the plumbing they share (common).

Installed as `agrpo.services` (agrpo/services links here)."""
