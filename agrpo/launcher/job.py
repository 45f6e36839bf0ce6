"""One training job on this machine: vLLM (unless it runs already), reward, trainer, rollout.

The job checks what it can before starting anything (ports, model, data, vLLM URLs: one
line each), starts the services in order under a supervisor, shows progress, and exits 0
once the trainer reports training done, stopping everything it started. Ctrl-C (or SIGTERM)
stops it cleanly: the trainer finishes its step and checkpoints as `save_strategy` asks; a
second Ctrl-C kills at once. Every service gets the job's run id (AGRPO_RUN_ID), so one the
supervisor restarts resumes this run.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from agrpo.services.common import weight_transports
from agrpo.services.common.preflight import INTERRUPTED_EXIT, STARTUP_ERROR_EXIT, StartupError, check_port
from agrpo.services.common.timeouts import (
    ROLLOUT_STATUS_POLL_S,
    SERVICE_STOP_GRACE_S,
    STATUS_POLL_S,
    TRAINER_STOP_EXTRA_S,
    VLLM_STOP_GRACE_S,
)

from .gpus import gpu_count, trainer_devices
from .preflight import check_job
from .processes import ServiceProcess, agrpo_argv, get_status, is_done, status_numbers
from .progress import StepFollower
from .supervisor import RestartPolicy, Supervised
from .vllm_plan import servers_to_start, settings_for, trainer_generates

ORDER = ("reward", "trainer", "rollout")


@dataclass
class JobOptions:
    """How the job runs beyond the config."""

    config_path: Path
    extra_flags: tuple[str, ...] = ()
    """Config flags given on the command line (passed to every service)."""
    cpus: dict[str, str] = field(default_factory=dict)
    """taskset cores per service ("vllm", "trainer", ...), e.g. for benchmarks on 2 cores."""
    env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Extra environment per service."""
    timeout_s: float | None = None
    """Give up (TimeoutError) when training is not done by then."""
    quiet: bool = False


class Job:
    """Starts, watches and stops everything one job needs."""

    def __init__(self, cfg, opts: JobOptions) -> None:
        self.cfg, self.opts = cfg, opts
        self.out = Path(cfg.resolved_output_dir)
        self.logs = self.out / "logs"
        self.run_id = cfg.run_id or f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.vllm_servers: list = []
        self.trainer_generates = False  # settled by start()
        self.services: dict[str, Supervised] = {}
        self.started_at = time.monotonic()
        self.status: dict = {"trainer": None, "rollout": None}
        """The last GetStatus answers of trainer and rollout (kept once they exit)."""
        self._rollout_polled = 0.0

    def say(self, line: str) -> None:
        if not self.opts.quiet:
            print(line, flush=True)

    # Start-up
    def start(self) -> None:
        """Preflight, vLLM, then reward, trainer and rollout started together (their imports and
        loading overlap; each connects to the others when they serve) and waited for in order."""
        check_job(self.cfg, self.opts.config_path.resolve().parent)
        self.trainer_gpus = self._trainer_gpus()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.trainer_generates = trainer_generates(self.cfg)
        if self.trainer_generates:
            url = self.cfg.vllm_urls[0]
            check_port("127.0.0.1", urlparse(url).port or 80, "vllm_server_base_url")
            self.say(f"[run] the trainer generates, at {url}: no vLLM (launcher.generation)")
        for url, port in [] if self.trainer_generates else servers_to_start(self.cfg):
            settings = settings_for(self.cfg, port)
            self.say(f"[run] starting vLLM for {url} ({'GPU' if settings.gpu else 'CPU'}, "
                     f"max_model_len {settings.max_model_len}); log {self.logs / 'vllm.log'}")
            server = settings.server(self.logs / f"vllm-{port}.log", self.cfg.launcher.ready_timeout_s)
            server.cpus, server.front_cpus = self.opts.cpus.get("vllm"), self.opts.cpus.get("vllm_front")
            self.vllm_servers.append(server.start())
            self.say(f"[run] vLLM healthy after {server.startup_s:.0f} s")
        policy = RestartPolicy(self.cfg.launcher.max_restarts, self.cfg.launcher.restart_window_s)
        for name in ORDER:
            proc = ServiceProcess(name, self._argv(name), self.logs / f"{name}.log", self._env(name))
            self.services[name] = Supervised(proc, policy, say=self.say)
            self.say(f"[run] starting {name}")
            self.services[name].start()
        for name in ORDER:
            self._await_serving(name)

    def _await_serving(self, name: str) -> None:
        """Until the service answers health checks. One that exits cleanly meanwhile has finished
        already (a job shorter than the start-up: watch() sees it done); one that exits with a
        start-up error raises that one line."""
        proc = self.services[name].process
        try:
            proc.wait_healthy(f"127.0.0.1:{getattr(self.cfg, name).port}", "", self.cfg.launcher.ready_timeout_s)
        except RuntimeError:
            code = proc.proc.poll() if proc.proc is not None else None
            if code == STARTUP_ERROR_EXIT:
                raise StartupError(proc.log_tail(1).strip()) from None
            if code != 0:
                raise

    def _trainer_gpus(self) -> str | None:
        """The trainer's CUDA_VISIBLE_DEVICES; None on CPU (or when the job's env sets it)."""
        launch = self.cfg.launcher
        count = 0 if launch.device == "cpu" or self.cfg.use_cpu else gpu_count()
        if launch.device == "gpu" and count == 0:
            raise StartupError("launcher.device='gpu': nvidia-smi lists no GPU on this machine")
        if count == 0 or "CUDA_VISIBLE_DEVICES" in self.opts.env.get("trainer", {}):
            return None
        return trainer_devices(self.cfg, count)

    def _argv(self, name: str) -> list[str]:
        return agrpo_argv(name, self.opts.config_path, *self.opts.extra_flags, cpus=self.opts.cpus.get(name))

    def _env(self, name: str) -> dict[str, str]:
        # User code beside the config file loads from any working directory.
        sys_path = list(dict.fromkeys([*self.cfg.sys_path, str(self.opts.config_path.resolve().parent)]))
        env = {"AGRPO_RUN_ID": self.run_id, "AGRPO_SYS_PATH": json.dumps(sys_path), **self.opts.env.get(name, {})}
        if name == "trainer":
            env["AGRPO_TRAINER__EXIT_WHEN_DONE"] = "true"
            if self.trainer_generates:
                env["AGRPO_TRAINER__WEIGHT_TRANSPORT"] = "local"
            if self.trainer_gpus is not None:
                env["CUDA_VISIBLE_DEVICES"] = self.trainer_gpus
            if self._shares_files_with_vllm():
                env["AGRPO_TRAINER__WEIGHT_TRANSPORT"] = "shared_path"
            elif self._shares_gpu_with_vllm():
                env["AGRPO_TRAINER__WEIGHT_TRANSPORT"] = "ipc"
            if "AGRPO_TRAINER__WEIGHT_TRANSPORT" in env and self.cfg.trainer.weight_transport == "auto":
                env.update(unread_sync_keys_reset(self.cfg, env["AGRPO_TRAINER__WEIGHT_TRANSPORT"]))
        return env

    def _shares_gpu_with_vllm(self) -> bool:
        """The job's one GPU vLLM runs on the trainer's single GPU: NCCL cannot connect the two,
        so weights go through CUDA IPC (our worker extension opens the trainer's buffer)."""
        gpu_servers = [server for server in self.vllm_servers if server.gpu]
        return (self.cfg.trainer.weight_transport == "auto" and self.trainer_gpus is not None and
                len(gpu_servers) == len(self.cfg.vllm_urls) == 1 and
                self.trainer_gpus == self.cfg.launcher.vllm_gpu)

    def _shares_files_with_vllm(self) -> bool:
        """Every server is a CPU vLLM this job started, so it reads the trainer's files: weights go
        as a file per version (no base64 JSON; a third of a sync on the demo task)."""
        return (self.cfg.trainer.weight_transport == "auto" and self.trainer_gpus is None and
                len(self.vllm_servers) == len(self.cfg.vllm_urls) > 0 and
                not any(server.gpu for server in self.vllm_servers))

    # Running
    def watch(self, follower: StepFollower | None) -> None:
        """Until training is done; raises RuntimeError with a service's last lines when one
        keeps crashing, TimeoutError past `timeout_s`."""
        deadline = self.started_at + self.opts.timeout_s if self.opts.timeout_s else None
        while True:
            if follower is not None:
                follower.poll()
            for svc in self.services.values():
                fatal = svc.check()
                if fatal:
                    raise RuntimeError(fatal)
            done = self._poll_status()
            if self.services["trainer"].done or done:
                self._poll_status(rollout=True)
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"training not done within {self.opts.timeout_s:.0f} s")
            time.sleep(STATUS_POLL_S)

    def _poll_status(self, rollout: bool = False) -> bool:
        """Refresh the statuses (rollout every second, or now: its last answer before it exits is what
        the summary counts as generated); True once the trainer says DONE."""
        trainer = get_status(f"127.0.0.1:{self.cfg.trainer.port}", "trainer")
        self.status["trainer"] = trainer or self.status["trainer"]
        if rollout or time.monotonic() - self._rollout_polled > ROLLOUT_STATUS_POLL_S:
            self.status["rollout"] = get_status(f"127.0.0.1:{self.cfg.rollout.port}", "rollout") or \
                self.status["rollout"]
            self._rollout_polled = time.monotonic()
        return is_done(trainer)

    def numbers(self) -> dict:
        """Plain numbers of the last statuses (processes.status_numbers)."""
        return status_numbers(self.status["trainer"], self.status["rollout"])

    def stop(self, kill: bool = False) -> None:
        """Trainer first (it finishes its step and checkpoints), then rollout, reward, vLLM."""
        grace = 0 if kill else self.cfg.trainer.grace_s + TRAINER_STOP_EXTRA_S
        for name in ("trainer", "rollout", "reward"):
            svc = self.services.get(name)
            if svc is not None:
                svc.done = True
                svc.process.stop(grace_s=grace if name == "trainer" else min(grace, SERVICE_STOP_GRACE_S))
        for server in reversed(self.vllm_servers):
            server.stop(grace=0 if kill else VLLM_STOP_GRACE_S)
        self.vllm_servers.clear()

    def run(self) -> int:
        """The whole job; the exit status (0 done, 1 failed, 130 interrupted)."""
        follower = None
        interrupted = _interrupts()
        launched = time.time()
        try:
            self.start()
            total = self.cfg.max_steps if self.cfg.max_steps > 0 else None
            follower = StepFollower(self._metrics_file(), total, disable_bar=bool(self.cfg.disable_tqdm), since=launched)
            self.watch(follower)
            follower.poll()
            follower.close()  # the bar ends its line before the closing one
            self.say(f"[run] training done in {time.monotonic() - self.started_at:.0f} s; "
                     f"output in {self.out}{self._profile_note()}")
            return 0
        except KeyboardInterrupt:
            try:  # a second Ctrl-C (or a signal to the whole process group) may come at once
                self.say("\n[run] stopping: the trainer finishes its step (Ctrl-C again to kill everything)")
                self.stop()
            except KeyboardInterrupt:
                self.stop(kill=True)
            if follower is not None:
                follower.close()  # the bar ends its line before the closing one
            self.say(self._resume_line())
            return INTERRUPTED_EXIT
        finally:
            if follower is not None:
                follower.close()
            self.stop(kill=interrupted.count > 1)

    def _resume_line(self) -> str:
        """After a stop: the checkpoint kept, and the command that continues from it (a plain
        restart starts a new run and moves this one aside)."""
        from agrpo.services.trainer import latest_checkpoint as latest

        kept = latest(self.out)
        if kept is None:
            return f"[run] stopped before the first checkpoint; output in {self.out}"
        again = " ".join(["agrpo run", str(self.opts.config_path), *self.opts.extra_flags,
                          "--resume_from_checkpoint", "true"])
        return f"[run] stopped; kept {kept}. To continue it: {again}"

    def _profile_note(self) -> str:
        """Where trainer.profile_steps wrote its tables and timeline, when it did."""
        window, folder = self.cfg.trainer.profile_steps, self.out / "profile"
        return f"; profile of steps {window[0]}-{window[1]} in {folder}" if window and folder.is_dir() else ""

    def _metrics_file(self) -> Path:
        return Path(self.cfg.trainer.metrics_jsonl or self.out / "metrics.jsonl")


class _Interrupts:
    count = 0


def _interrupts() -> _Interrupts:
    """SIGTERM unwinds like Ctrl-C; the count tells a second one apart."""
    state = _Interrupts()

    def handler(signum, frame):
        state.count += 1
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return state


def unread_sync_keys_reset(cfg, transport: str) -> dict[str, str]:
    """AGRPO_TRAINER__* variables that put back the defaults of the weight-sync keys `transport`
    does not read. The user left weight_transport on auto and the launcher chose: a key meant for
    another transport does nothing here, which is no error of theirs (a transport the user names
    is checked strictly: AgrpoConfig)."""
    section = type(cfg.trainer)
    unread = set(weight_transports.SYNC_KEYS) - set(weight_transports.reads(transport))
    return {f"AGRPO_TRAINER__{key.upper()}": json.dumps(section.model_fields[key].default)
            for key in sorted(unread) if getattr(cfg.trainer, key) != section.model_fields[key].default}
