"""Service processes a job (agrpo run, the demo) starts, watches and always stops (Ctrl-C included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import deque
from pathlib import Path

from agrpo.services.common.lifetime import dying_with_this_process
from agrpo.services.common.timeouts import PROCESS_EXIT_WAIT_S, STATUS_CALL_TIMEOUT_S


class ServiceProcess:
    """One `agrpo <service>` process in its own process group, logging to a file."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                    "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "AGRPO_LOG_FORMAT": "json",
                    **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServiceProcess:
        """Start in a new session so stop() can reach every child."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(dying_with_this_process(self.argv), env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, address: str, service: str, timeout_s: float) -> None:
        """Poll gRPC health until SERVING; raise with the log tail if it dies or times out."""
        from agrpo.launcher.probe import wait_serving

        def check_alive() -> None:
            if not self.alive():
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"{self.name} exited with code {code}:\n{self.log_tail()}")

        if not wait_serving(address, service, timeout_s, check_alive, interval_s=0.5):
            raise TimeoutError(f"{self.name} not SERVING after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        """The last lines of the process log."""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=n))
        except OSError:
            return "<no log>"

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM (graceful), then SIGKILL the whole group after grace_s."""
        if self.proc is None:
            return
        try:
            self.proc.terminate()
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=PROCESS_EXIT_WAIT_S)


def get_status(address: str, service: str):
    """GetStatus of the trainer or rollout at `address`; None when it does not answer."""
    import grpc

    from agrpo.v1 import common_pb2, rollout_service_pb2_grpc, trainer_service_pb2_grpc

    stub_cls = {"trainer": trainer_service_pb2_grpc.TrainerServiceStub,
                "rollout": rollout_service_pb2_grpc.RolloutServiceStub}[service]
    try:
        with grpc.insecure_channel(address) as channel:
            return stub_cls(channel).GetStatus(common_pb2.GetStatusRequest(), timeout=STATUS_CALL_TIMEOUT_S)
    except grpc.RpcError:
        return None


def is_done(status) -> bool:
    """True once the trainer reports SERVING_STATE_DONE (it keeps serving status after)."""
    from agrpo.v1 import common_pb2

    return status is not None and status.service.state == common_pb2.SERVING_STATE_DONE


def status_numbers(trainer, rollout) -> dict:
    """Plain numbers out of the last trainer / rollout GetStatus answers (either may be None)."""
    out: dict = {}
    if trainer is not None and trainer.HasField("trainer"):
        t = trainer.trainer
        out.update(trainer_step=t.step, trainer_policy_version=t.policy_version,
                   samples_received=t.samples_received, trainer_dropped=dict(t.samples_dropped),
                   trainer_idle_s=t.idle_s, trainer_busy_s=t.busy_s, pacing_window=t.pacing_window)
    if rollout is not None and rollout.HasField("rollout"):
        r = rollout.rollout
        out.update(rollout_drops=dict(r.drops), prompts_issued=r.prompts_issued,
                   prompts_reissued=r.prompts_reissued, samples_sent=r.samples_sent,
                   samples_generated=r.samples_generated, generation_idle_s=r.generation_idle_s,
                   generation_s=r.generation_s)
        if "samples_received" in out:  # rollout's last answer may be older than the trainer's (it
            # exits first, or a poll timed out under load); nothing was received that was not generated
            out["samples_generated"] = max(r.samples_generated, out["samples_received"])
    return out


def agrpo_argv(service: str, config_path: Path, *flags: str, cpus: str | None = None) -> list[str]:
    """The command line of one service, run by this interpreter (on `cpus` only, by taskset).
    A trainer with trainer.num_processes > 1 starts its ranks itself (ranks.run_ranks)."""
    pin = ["taskset", "-c", cpus] if cpus else []
    return [*pin, sys.executable, "-m", "agrpo.cli", service, "--config", str(config_path), *flags]
