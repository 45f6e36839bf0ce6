"""Trainer metrics: Prometheus series (agrpo_trainer_*) and the per-step log.

The step log uses TRL's metric names (loss, grad_norm, learning_rate, ratio, kl,
entropy, clip_ratio/*, completions/mean_length, sample/*, batch/*, perf/*), one JSON
object per line in the metrics file, a readable console line, and the `report_to`
backends (tensorboard, wandb, trackio) when they are installed.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path

from agrpo.services.common.logging import get_logger
from agrpo.services.common.metrics import Metrics

log = get_logger("trainer.steps")

STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32)


class TrainerMetrics:
    """The Prometheus series of the trainer."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        m = self.registry_owner = metrics or Metrics("trainer")
        self.step = m.gauge("step", "Optimizer steps taken.")
        self.policy_version = m.gauge("policy_version", "Current policy version.")
        self.received = m.counter("samples_received", "Samples received (duplicates included).")
        self.trained = m.counter("samples_trained", "Samples trained.")
        self.dropped = m.counter("samples_dropped", "Samples not trained, by reason.", ("reason",))
        self.buffered = m.gauge("buffered_samples", "Samples waiting in the buffer.")
        self.staleness = m.histogram("sample_staleness_versions",
                                     "Trainer version minus sample version at consumption.",
                                     buckets=STALENESS_BUCKETS)
        self.idle = m.gauge("idle_fraction", "Fraction of the last step spent waiting for samples.")
        self.idle_seconds = m.counter("idle_seconds", "Seconds the training loop waited for samples.")
        self.busy_seconds = m.counter("busy_seconds", "Seconds the training loop trained, synced or logged.")
        self.pacing_window = m.gauge("pacing_window_samples",
                                     "Samples rollout may have between dispatch and training (pacing).")
        self.mismatch_kl = m.gauge("mismatch_k3_kl",
                                   "Mean per-token k3 KL between the trainer's and vLLM's logprobs, last step.")
        self.step_time = m.histogram("step_seconds", "Wall time of one optimizer step (compute).")
        self.tokens_per_s = m.gauge("tokens_per_second", "Forwarded tokens per second of compute.")
        self.sync_time = m.histogram("weight_sync_seconds", "Weight-sync time per phase.", ("phase",))
        self.sync_failures = m.counter("weight_sync_failures", "Failed server syncs, by phase.", ("phase",))

    def on_intake(self, kind: str, sample=None) -> None:
        """Intake events: "received", or why a sample was not buffered."""
        if kind == "received":
            self.received.inc()
        else:
            self.dropped.labels(kind).inc()

    def serve(self, port: int | None, host: str = "0.0.0.0") -> int | None:
        return self.registry_owner.serve(port, host)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


CONSOLE_KEYS = ("loss", "grad_norm", "learning_rate", "ratio", "kl", "entropy",
                "clip_ratio/region_mean", "completions/mean_length", "batch/num_samples",
                "perf/tokens_per_s", "perf/weight_sync_s", "policy_version")


class StepLogger:
    """Writes step metrics every `logging_steps` to JSONL, console and report_to backends."""

    def __init__(self, path: Path | None, logging_steps: float, report_to: str | list[str],
                 run_name: str | None = None, logging_dir: str | None = None, project: str = "agrpo") -> None:
        self.path = path
        self.every = max(1, int(logging_steps)) if logging_steps >= 1 else 1
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        targets = [report_to] if isinstance(report_to, str) else list(report_to)
        self.backends = _backends(targets, run_name, logging_dir, project)

    def log(self, step: int, metrics: dict, force: bool = False) -> None:
        if not force and step % self.every:
            return
        clean = {k: v for k, v in metrics.items() if not (isinstance(v, float) and math.isnan(v))}
        record = {"step": step, "time": time.time(), **clean}
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        line = " | ".join(f"{k} {_fmt(clean[k])}" for k in CONSOLE_KEYS if k in clean)
        log.info("step %d | %s", step, line, extra={"step": step})
        for backend in self.backends:
            try:
                backend(step, clean)
            except Exception:  # a logging backend never stops training
                log.exception("report_to backend failed")


def _backends(targets: list[str], run_name, logging_dir, project) -> list:
    out: list[Callable[[int, dict], object]] = []
    names = set(targets)
    if "all" in names:
        names = {"tensorboard", "wandb", "trackio"}
    if "tensorboard" in names:
        try:
            from torch.utils.tensorboard import SummaryWriter
            writer = SummaryWriter(logging_dir)
            out.append(lambda s, m: [writer.add_scalar(k, v, s) for k, v in m.items()
                                     if isinstance(v, (int, float))])
        except ImportError:
            log.warning("report_to tensorboard: tensorboard not installed")
    for name in ("wandb", "trackio"):
        if name in names:
            try:
                mod = __import__(name)
                mod.init(project=project, name=run_name)
                out.append(_log_to(mod))
            except ImportError:
                log.warning("report_to %s: not installed", name)
    return out


def _log_to(mod) -> Callable[[int, dict], object]:
    """A backend logging through `mod` (wandb, trackio): mod.log(metrics, step=step)."""
    return lambda s, m: mod.log(m, step=s)
