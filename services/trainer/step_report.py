"""What a step leaves besides new weights: its metrics (metrics.jsonl, report_to), the Prometheus
gauges, and TRL's log_completions lines."""

from __future__ import annotations

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.logging import get_logger
from agrpo.services.common.metrics import IdleClock

from .gathering import StepGatherer, StepInput
from .metrics import StepLogger, TrainerMetrics
from .publisher import WeightPublisher
from .state import TrainState
from .step_metrics import FlopModel, step_metrics

log = get_logger("trainer.loop")


class StepReporter:
    """Logs each step (step_metrics.py names the numbers)."""

    def __init__(self, cfg: AgrpoConfig, state: TrainState, metrics: TrainerMetrics, step_log: StepLogger,
                 tokenizer, flops: FlopModel, idle: IdleClock, gatherer: StepGatherer,
                 publisher: WeightPublisher) -> None:
        self.cfg, self.state, self.metrics, self.step_log = cfg, state, metrics, step_log
        self.tokenizer, self.flops, self.idle = tokenizer, flops, idle
        self.gatherer, self.publisher = gatherer, publisher
        self._clock_seen = (0.0, 0.0)

    def log(self, step_in: StepInput, stats: dict) -> None:
        g = self.gatherer
        metrics = step_metrics(step_in, stats, version=self.state.version, ledger=self.state.ledger,
                               drops=g.drops, flops=self.flops, peak_tflops=self.cfg.trainer.peak_tflops,
                               last_sync=self.publisher.last_sync, token_budget=g.token_budget(),
                               sync_bytes=self.publisher.last_sync_bytes)
        self.publisher.last_sync = {}
        self._gauges(metrics)
        step = self.state.step
        self.step_log.log(step, metrics, force=step == 1 and self.cfg.logging_first_step)
        every = max(1, int(self.cfg.logging_steps)) if self.cfg.logging_steps >= 1 else 1
        if self.cfg.log_completions and step % every == 0:
            self._print_completions(step_in)

    def _gauges(self, metrics: dict) -> None:
        m = self.metrics
        m.tokens_per_s.set(metrics.get("perf/tokens_per_s", 0.0))
        m.idle.set(metrics.get("perf/idle_fraction", 0.0))
        m.buffered.set(len(self.gatherer.buffer))
        m.pacing_window.set(self.gatherer.pace.window)
        m.mismatch_kl.set(metrics.get("mismatch/k3_kl_mean", 0.0))
        idle, total = self.idle.idle_s, self.idle.total_s
        seen_idle, seen_total = self._clock_seen
        m.idle_seconds.inc(max(0.0, idle - seen_idle))
        m.busy_seconds.inc(max(0.0, (total - idle) - (seen_total - seen_idle)))
        self._clock_seen = (idle, total)

    def _print_completions(self, step_in: StepInput) -> None:
        """TRL's log_completions: prompt, completion, each function's reward and the advantage."""
        samples = step_in.samples
        shown = samples[:self.cfg.num_completions_to_print or len(samples)]
        lines = [f"step {self.state.step}: {len(shown)} of {len(samples)} completions"]
        for s in shown:
            prompt = s.prompt_text or self.tokenizer.decode(s.input_ids[:s.prompt_length])
            text = s.completion_text or self.tokenizer.decode(
                [t for t, m in zip(s.input_ids, s.completion_mask) if m])
            parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(s.reward_components.items()))
            lines += [f"  prompt:     {_one_line(prompt)}", f"  completion: {_one_line(text)}",
                      f"  reward {s.reward:.3f}" + (f" ({parts})" if parts else "") + f" | advantage {s.advantage:+.3f}"]
        log.info("%s", "\n".join(lines))


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + " ..."
