"""Broken rewards stop the run instead of training silently on NaN.

Per step: the share of samples each reward function could not score (NaN / None), and the
share with no usable reward at all (every function NaN: the total is NaN, the advantage 0,
nothing is learned). A function failing for most samples is a warning naming it and its
last error; no usable reward for most samples during `patience` consecutive steps stops
the run with that line. Pure bookkeeping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agrpo.services.common.preflight import StartupError


@dataclass
class RewardHealth:
    """Consecutive steps without usable rewards, and which functions are failing."""

    patience: int = 3
    """Steps in a row with most samples unrewarded before the run stops; 0: never stop."""
    bad_steps: int = 0

    def check(self, samples) -> list[str]:
        """Warnings for this step's samples; raises StartupError once patience runs out."""
        if not samples:
            return []
        n = len(samples)
        warnings, worst = [], None
        names = sorted({k for s in samples for k in s.reward_components})
        for name in names:
            bad = [s for s in samples if math.isnan(s.reward_components.get(name, math.nan))]
            if len(bad) * 2 > n:
                error = next((s.reward_errors[name] for s in bad if name in s.reward_errors), None)
                line = (f"reward function {name!r} failed or returned None for {len(bad)}/{n} samples"
                        + (f"; last error: {error}" if error else ""))
                warnings.append(line)
                worst = worst or line
        unrewarded = sum(1 for s in samples if math.isnan(s.reward))
        if unrewarded * 2 > n:
            self.bad_steps += 1
            if self.patience and self.bad_steps >= self.patience:
                raise StartupError(f"no usable reward for most samples in {self.bad_steps} consecutive steps "
                                   f"({unrewarded}/{n} in the last): {worst or 'every reward was NaN'} "
                                   "(trainer.reward_failure_patience)")
        else:
            self.bad_steps = 0
        return warnings
