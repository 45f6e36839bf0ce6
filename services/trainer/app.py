"""Wire the trainer together: restored state, buffer, intake, policy board, metrics, loop.

Which checkpoint to resume from (if any; run_record.py decides: a restart of the same run,
or resume_from_checkpoint) is settled first, so the ledger the intake checks against is the
restored one from the start, and the audit log and metrics are rewound to it. `boot()` loads the model and cold-syncs
every vLLM server (slow, so the gRPC server answers NOT_SERVING meanwhile); the server then runs
`app.loop`. No gRPC here: services/trainer/server.py serves this app.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.common.identity import Identity
from agrpo.services.common.logging import get_logger
from agrpo.services.common.preflight import StartupError
from agrpo.services.common.versions import sample_versions

from . import checkpoint, run_record
from .buffer import SampleBuffer
from .intake import Intake
from .ledger import Ledger
from .metrics import TrainerMetrics
from .pacing import Pace
from .policy import PolicyBoard
from .ranks import RankGroup, World
from .sample import Sample
from .state import TrainState

if TYPE_CHECKING:
    from .loop import TrainerLoop

log = get_logger("trainer.app")


def build_pace(cfg: AgrpoConfig, ranks: int = 1) -> Pace:
    """The pacing window from the config (services/trainer/pacing.py) for a trainer of `ranks`."""
    return Pace(max_staleness=cfg.max_staleness, per_step=cfg.samples_per_step(ranks), capacity=cfg.queue_maxsize,
                group_size=cfg.num_generations, steps_per_version=cfg.weight_sync_steps,
                sync=cfg.trainer.resolved_schedule == "sync", fixed_window=cfg.trainer.credit_window)


class TrainerApp:
    """The running trainer: what the servicer answers from and the server drives."""

    def __init__(self, cfg: AgrpoConfig, world: World | None = None) -> None:
        self.cfg = cfg
        self.identity = Identity("trainer")
        self.ranks = RankGroup(world or World())  # rank 0's handle on the trainer's other ranks
        self.metrics_file = Path(cfg.trainer.metrics_jsonl or Path(cfg.resolved_output_dir) / "metrics.jsonl")
        start = run_record.plan(Path(cfg.resolved_output_dir), cfg.run_id, cfg.resume_from_checkpoint,
                                self.metrics_file, cfg.max_staleness)
        self.record, self.resumed_from = start.record, start.checkpoint
        if start.archived:
            log.warning("output_dir held an earlier run: moved to %s (set resume_from_checkpoint: true "
                        "to continue it instead)", start.archived)
        self.state = self._restore(start.restart)
        self.buffer = SampleBuffer(cfg.queue_maxsize)
        self.board = PolicyBoard()
        self.metrics = TrainerMetrics()
        self.intake = Intake(self.buffer, self.state.ledger, build_pace(cfg, self.ranks.world.size), hooks=self)
        self.loop: TrainerLoop | None = None  # once boot() has loaded the model
        self.ready = False

    def _restore(self, restart: bool) -> TrainState:
        state = (checkpoint.read_state(self.resumed_from) if self.resumed_from is not None
                 else TrainState(ledger=Ledger()))
        audit = Path(self.cfg.resolved_output_dir) / "trained_samples.jsonl"
        if self.resumed_from is not None or restart:
            moved = run_record.rewind(audit, state.step) + run_record.rewind(self.metrics_file, state.step)
            head = f"continuing run {self.record.run_id} from" if restart else "resuming"
            (log.warning if restart else log.info)(
                "%s %s: step %d, version %d, %d prompts trained%s%s", head,
                self.resumed_from or "scratch", state.step, state.version, state.ledger.prompts_trained,
                f"; {moved} records of later steps moved to *.rolled_back.jsonl" if moved else "",
                " (resume_from_checkpoint: false starts a new run instead)" if restart else "")
        return state

    # IntakeHooks
    def on_intake(self, kind: str, sample: Sample | None) -> None:
        self.metrics.on_intake(kind, sample)

    def version_problem(self, sample: Sample) -> str | None:
        """Why a sample's versions cannot be trained here: a token of weights a restart rolled
        back (off the lineage), a version newer than the trainer's, or a span claiming a
        version no weights ever had (past the high-water mark)."""
        st = self.state
        for v in sorted(sample_versions(sample.policy_version, (v for v, _, _ in sample.version_spans))):
            if st.lineage.index(v) is None:
                return f"off the trainer's lineage: version {v} names weights a restart rolled back"
        distance = st.lineage.distance(st.version, sample.policy_version)
        assert distance is not None  # both on the lineage: the trainer's version, and the sample's (checked above)
        if distance < 0:
            return f"version {sample.policy_version} is newer than the trainer's {st.version}"
        newest = max(v for v, _, _ in sample.version_spans) if sample.version_spans else 0
        if newest > self.record.max_version:
            return f"a span's version {newest} was never published (highest {self.record.max_version})"
        return None

    async def boot(self) -> None:
        """Load the model (or the checkpoint), open the weight syncer, cold-sync every server."""
        t0 = time.perf_counter()
        from .setup import build_loop  # torch and transformers: seconds

        imported = time.perf_counter()
        try:
            self.loop = await asyncio.to_thread(build_loop, self)
        except (OSError, ValueError) as exc:
            key = (f"resume_from_checkpoint ({self.resumed_from})" if self.resumed_from
                   else f"model={self.cfg.model!r}")
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise StartupError(f"{key} cannot be loaded: {first}") from exc
        self.intake.bind_limits(self.loop)
        built = time.perf_counter()
        await self.loop.syncer.open()
        await self.loop.cold_sync()
        self.ready = True
        done = time.perf_counter()
        log.info("trainer ready at version %d (step %d): imports %.1f s, build %.1f s, weight sync %.1f s; "
                 "process up %s", self.state.version, self.state.step, imported - t0, built - imported,
                 done - built, _uptime())

    def stop_training(self) -> None:
        """Finish the step in progress, then stop."""
        if self.loop is not None:
            self.loop.stop()

    async def close(self) -> None:
        """End every stream (watchers, producers) and release the syncer."""
        self.board.close()
        for stream in list(self.intake.streams.values()):
            stream.send(None)
        if self.loop is not None:
            await self.loop.syncer.close()
            self.ranks.stop()  # the other ranks exit

    def status(self) -> dict:
        """GetStatus's numbers (the servicer adds the resume point)."""
        ledger = self.state.ledger
        drops = dict(self.loop.drops) if self.loop else {}
        drops.update({k: v for k, v in self.intake.stats.drops.items() if v})
        return {"step": self.state.step, "policy_version": self.state.version,
                "completed_epochs": ledger.completed_epochs, "prompts_trained": ledger.prompts_trained,
                "samples_received": self.intake.stats.received, "samples_trained": len(ledger.trained_ids),
                "samples_dropped": drops, "buffered_samples": len(self.buffer),
                "buffer_capacity": self.buffer.capacity,
                "target_steps": self.cfg.max_steps if self.cfg.max_steps > 0 else 0,
                "idle_s": self.loop.idle.idle_s if self.loop else 0.0,
                "busy_s": self.loop.idle.total_s - self.loop.idle.idle_s if self.loop else 0.0,
                "pacing_window": self.intake.pace.window}


def _uptime() -> str:
    """Seconds since this process started (Linux /proc), for the start-up log line."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot_s = float(Path("/proc/uptime").read_text().split()[0])
        return f"{boot_s - start_ticks / os.sysconf('SC_CLK_TCK'):.1f} s"
    except (OSError, ValueError, IndexError):
        return "unknown"
