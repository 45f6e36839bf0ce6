"""chaos.py: kill -9 the running system's services at random, then prove from the audit log
that nothing was lost, nothing trained twice and nothing trained past max_staleness.

  .venv/bin/python benchmarks/chaos.py --kills 24                 # the long run (>= 20 kills)
  .venv/bin/python benchmarks/chaos.py --short                    # 6 kills, as CI runs it

The system runs as the demo does (`agrpo demo`'s job: real vLLM, reward, trainer, rollout
processes under the launcher's supervisor, which restarts what dies; vLLM is restarted
here). Every `--min-s`..`--max-s` seconds one target is killed with SIGKILL (its whole
process group): trainer, rollout, reward, vllm, plus the trainer in the middle of a weight
sync ("trainer@sync": vLLM paused, or the trainer's weight-sync request open at vLLM, as the
one-call swap of trainer.weight_swap pauses vLLM only inside that request) and while a
checkpoint is being written ("trainer@save").
Each service is killed at least kills/6 times. After the last kill the run trains
`--after` more steps and until an epoch later than the last kill's is whole (so a prompt any
kill lost shows as a gap in an epoch a whole one follows), stops cleanly, and `agrpo audit`'s
checker reads the raw audit log: every prompt key trained by one group, no sample id twice, no
prompt missing from an epoch a whole epoch follows (the run stopped early: it may owe the
prompts in flight at the stop, which its resume point owes too), every group trained whole,
no staleness past the bound, and the latest checkpoint's ledger is the log's history up to its
step. Recovery: from a kill until the service serves
again (gRPC health, or vLLM's /health), then until the trainer logs a step after that. Prints
one row per kill and the verdict; exits 1 when the audit fails or training never recovers.

Two supervisors (`--supervisor`):
- `launcher` (default): `agrpo run`'s own, which gives every service the job's run id.
- `plain`: benchmarks/plain_supervisor.py, as systemd's Restart=always or a compose restart
  policy: the same command line again, with the config as a user writes it (no run_id, no
  resume flag). The trainer must continue its run after every kill: nothing moved to
  `previous/`, the run id of run.json unchanged.

  .venv/bin/python benchmarks/chaos.py --short --supervisor plain

At a real shape on one GPU (vLLM and the trainer share it, weights over CUDA IPC):

  python benchmarks/chaos.py --gpu --model 1.5b --kills 6 --set per_device_train_batch_size=64 \
      --set max_completion_length=1024

`--lora` trains a LoRA adapter synced alone into vLLM (docs/lora.md): trainer@sync then lands
in an adapter sync, trainer@save in an adapter checkpoint, and a killed vLLM comes back without
adapters, which the trainer must notice and sync again.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

SERVICES = ("trainer", "rollout", "reward", "vllm")


def plan(kills: int, rng: random.Random) -> list[str]:
    """The kill order: the trainer mid-sync and mid-save once each, then the four services
    in turn (shuffled per round), so each gets about (kills - 2) / 4."""
    order = ["trainer@sync", "trainer@save"]
    while len(order) < kills:
        round_ = list(SERVICES)
        rng.shuffle(round_)
        order += round_
    order = order[:max(kills, 2)]
    rng.shuffle(order)
    return order


def last_step(metrics: Path) -> int:
    try:
        lines = metrics.read_text().splitlines()
    except OSError:
        return 0
    return max((json.loads(x)["step"] for x in lines if x.strip()), default=0)


def _paused(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/is_paused", timeout=1) as r:
            return bool(json.loads(r.read()).get("is_paused"))
    except (OSError, ValueError):
        return False


def _in_vllm_call(pid: int, port: int) -> bool:
    """Process `pid` has a TCP connection open to localhost:`port` (the trainer talks to vLLM
    only to sync weights and check their label, one fresh connection per call)."""
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        inodes = {link[8:-1] for link in links if link.startswith("socket:[")}
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:  # the process or one of its fds went away meanwhile
        return False
    for row in rows:
        fields = row.split()  # sl local remote state ... inode
        if fields[3] == "01" and int(fields[2].split(":")[1], 16) == port and fields[9] in inodes:
            return True
    return False


def _vllm_healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def _saving(output_dir: Path) -> bool:
    return any(output_dir.glob(".checkpoint-*.tmp"))


def wait_for_moment(target: str, system, vllm, output_dir: Path, metrics: Path, limit_s: float) -> float | None:
    """For trainer@sync / trainer@save: once the trainer has logged a step (on a cold machine
    the first one can come a minute after the services serve), poll (2 ms) until vLLM is paused
    or the trainer's sync request is open / a checkpoint is being written. Returns the seconds
    waited, or None when the moment did not come within limit_s of the first step (the kill
    happens anyway)."""
    if target == "trainer@sync":
        def seen() -> bool:
            trainer = _process("trainer", system, vllm)
            return (trainer is not None and _in_vllm_call(trainer.pid, vllm.port)) or _paused(vllm.base_url)
    elif target == "trainer@save":
        seen = lambda: _saving(output_dir)  # noqa: E731
    else:
        return 0.0
    t0 = time.monotonic()
    while last_step(metrics) == 0 and time.monotonic() - t0 < limit_s:
        time.sleep(0.2)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if seen():
            return time.monotonic() - t0
        time.sleep(0.002)
    return None


def _process(name: str, system, vllm):
    return vllm.proc if name == "vllm" else system.process(name)


class LauncherSystem:
    """The services under `agrpo run`'s supervisor (the job's run id in their environment)."""

    def __init__(self, job) -> None:
        self.job = job

    def process(self, name: str):
        return self.job.services[name].process.proc

    def supervise(self, errors: list) -> None:
        """The launcher's watch loop: restarts what dies, raises on give-up."""
        def watch() -> None:
            try:
                self.job.watch(None)
            except BaseException as exc:  # noqa: BLE001 - reported by run()
                errors.append(exc)
        threading.Thread(target=watch, daemon=True).start()

    def stop(self) -> None:
        self.job.stop()


class PlainSystem:
    """The services under a plain supervisor: the same command line again after every exit."""

    def __init__(self, config: Path, logs: Path) -> None:
        from agrpo.launcher.processes import agrpo_argv
        from plain_supervisor import PlainSupervisor

        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
               "HF_DATASETS_OFFLINE": "1", "AGRPO_LOG_FORMAT": "json"}
        env.pop("AGRPO_RUN_ID", None)
        self.supervisor = PlainSupervisor({name: agrpo_argv(name, config) for name in ("reward", "trainer", "rollout")},
                                          env, logs).start()

    def process(self, name: str):
        return self.supervisor.process(name)

    def supervise(self, errors: list) -> None:
        """Its own thread restarts what dies."""

    def stop(self) -> None:
        self.supervisor.stop(("trainer", "rollout", "reward"))


def kill(target: str, system, vllm, wait_s: float = 120.0) -> bool:
    """SIGKILL the target's process group once it runs (it may still be restarting from
    the last kill); vLLM is started again here (the supervisor restarts the others)."""
    name, deadline = target.split("@")[0], time.monotonic() + wait_s
    while (proc := _process(name, system, vllm)) is None or proc.poll() is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    if name == "vllm":
        threading.Thread(target=vllm.start, daemon=True).start()
    return True


def _serving(port: int) -> bool:
    """The gRPC health check of the service on `port` answers SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
        return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def recovery(target: str, cfg, vllm, metrics: Path, limit_s: float) -> tuple[float | None, float | None]:
    """(seconds until the killed service serves again, seconds until the trainer then logs
    a new step); None where that did not happen within limit_s of the kill."""
    name, t0 = target.split("@")[0], time.monotonic()
    if name == "vllm":
        back = lambda: _vllm_healthy(vllm.base_url)  # noqa: E731
    else:
        port = {"trainer": cfg.trainer.port, "rollout": cfg.rollout.port, "reward": cfg.reward.port}[name]
        back = lambda: _serving(port)  # noqa: E731
    back_s = step_s = None
    while time.monotonic() - t0 < limit_s:
        if back_s is None and back():
            back_s, before = time.monotonic() - t0, last_step(metrics)
        elif back_s is not None and last_step(metrics) > before:
            step_s = time.monotonic() - t0
            break
        time.sleep(0.2)
    return back_s, step_s


def start(a):
    """vLLM, the config and the services under the chosen supervisor."""
    from agrpo.demo.cli import parse_sets
    from agrpo.demo.gpu import GpuOptions
    from agrpo.demo.runner import DemoOptions, start_job, start_vllm_and_config

    overrides = {"save_steps": a.save_steps,  # vLLM is one of the targets: it generates here
                 "launcher": {"generation": "vllm", "max_restarts": 10_000, "restart_window_s": 30.0}}
    if a.supervisor == "launcher":
        overrides["run_id"] = f"chaos-{a.seed}"
    if a.lora:  # a LoRA adapter, synced alone into vLLM (docs/lora.md)
        overrides["peft"] = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}
    if a.trainer_ranks > 1:  # the trainer sharded (FSDP2): a kill of it is torchrun's, its ranks die with it
        overrides["trainer"] = {"num_processes": a.trainer_ranks}
    for key, value in parse_sets(a.set).items():  # the shape, e.g. per_device_train_batch_size=64
        overrides.setdefault(key, value)
    gpu = GpuOptions(vllm_gpu="0", trainer_gpu="0") if a.gpu else None  # one GPU: CUDA IPC
    opts = DemoOptions(model=a.model, steps=100_000, out=a.out, max_staleness=a.max_staleness,
                       num_prompts=a.num_prompts, timeout_s=0, overrides=overrides, gpu=gpu)
    if a.supervisor == "launcher":
        vllm, job, cfg = start_job(opts, {})
        return vllm, LauncherSystem(job), cfg
    server, config, cfg = start_vllm_and_config(opts, {})
    assert server is not None, "launcher.generation vllm always starts one"
    return server, PlainSystem(config, a.out / "logs"), cfg


def run(a) -> int:
    from agrpo.services.trainer import checkpoint, run_record
    from agrpo.services.trainer.audit import agrees_with_checkpoint, verify

    rng = random.Random(a.seed)
    vllm, system, cfg = start(a)
    metrics, output_dir = a.out / "metrics.jsonl", Path(cfg.resolved_output_dir)
    errors: list[BaseException] = []
    system.supervise(errors)
    rows, failed, first_run_id = [], False, None
    try:
        for n, target in enumerate(plan(a.kills, rng), 1):
            time.sleep(rng.uniform(a.min_s, a.max_s))
            waited_s = wait_for_moment(target, system, vllm, output_dir, metrics, limit_s=120)
            step = last_step(metrics)
            first_run_id = first_run_id or getattr(run_record.read(output_dir), "run_id", None)
            killed = kill(target, system, vllm)
            back_s, step_s = recovery(target, cfg, vllm, metrics, a.recover_s)
            rows.append({"kill": n, "target": target, "killed": killed, "at_moment": waited_s is not None,
                         "moment_wait_s": _round(waited_s), "step": step,
                         "back_s": _round(back_s), "next_step_s": _round(step_s)})
            print(json.dumps(rows[-1]), flush=True)
            if step_s is None or errors:
                failed = True
                print(f"chaos: not recovered ({errors[0] if errors else 'no new step'})", flush=True)
                break
        if not failed and not train_on(metrics, output_dir / "trained_samples.jsonl", a.after, a.num_prompts,
                                       a.recover_s):
            failed = True
            print(f"chaos: no whole epoch after the last kill's within {a.recover_s:.0f} s", flush=True)
    finally:
        system.stop()
        vllm.stop()
    record = run_record.read(output_dir)
    verdict = verify(output_dir / "trained_samples.jsonl", cfg.max_staleness, a.num_prompts,
                     finished=record is not None and record.finished)
    newest = checkpoint.latest(output_dir)
    if newest is not None:
        verdict.problems += agrees_with_checkpoint(output_dir / "trained_samples.jsonl", newest)
    verdict.problems += one_run(output_dir, first_run_id)
    report(rows, verdict, a.out, newest)
    return 0 if verdict.ok and not failed else 1


def train_on(metrics: Path, log: Path, steps: int, prompts_per_epoch: int, limit_s: float) -> bool:
    """Wait for `steps` more steps and a whole epoch later than the one in progress now; False
    when that takes more than `limit_s`."""
    from agrpo.services.trainer.audit import trained_per_epoch

    goal, epoch_now = last_step(metrics) + steps, max(trained_per_epoch(log), default=0)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        whole_later = any(n >= prompts_per_epoch for e, n in trained_per_epoch(log).items() if e > epoch_now)
        if whole_later and last_step(metrics) >= goal:
            return True
        time.sleep(0.5)
    return False


def one_run(output_dir: Path, run_id: str | None) -> list[str]:
    """Every restart continued the run: none was moved aside, and run.json names the same run."""
    from agrpo.services.trainer import run_record

    problems = []
    if (output_dir / run_record.PREVIOUS).exists():
        moved = sorted(p.name for p in (output_dir / run_record.PREVIOUS).iterdir())
        problems.append(f"a restart started a new run: {moved} moved to {run_record.PREVIOUS}/")
    now = getattr(run_record.read(output_dir), "run_id", None)
    if run_id and now != run_id:
        problems.append(f"run.json names run {now}, not {run_id}")
    return problems


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def report(rows: list[dict], verdict, out: Path, checkpoint_dir: Path | None) -> None:
    by_target = {t: sum(r["target"] == t for r in rows) for t in (*SERVICES, "trainer@sync", "trainer@save")}
    print("\nkill | target | at the moment | last step | serving again after (s) | next step after (s)")
    for r in rows:
        print(f"{r['kill']} | {r['target']} | {r['at_moment']} | {r['step']} | {r['back_s']} | {r['next_step_s']}")
    summary = {}
    for t in by_target:
        times = [r["next_step_s"] for r in rows if r["target"] == t and r["next_step_s"] is not None]
        if times:
            summary[t] = {"kills": len(times), "median_s": round(statistics.median(times), 1), "max_s": max(times)}
            print(f"{t}: {len(times)} kills, next step after median {summary[t]['median_s']} s, max {max(times)} s")
    print("audit:", verdict.line())
    if checkpoint_dir is not None and verdict.ok:
        print(f"the audit log agrees with {checkpoint_dir.name}'s ledger; one run throughout")
    (out / "chaos.json").write_text(json.dumps({"kills": rows, "recovery": summary, "audit": verdict.line(),
                                                "checkpoint": checkpoint_dir.name if checkpoint_dir else None,
                                                "ok": verdict.ok}, indent=2))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=24)
    p.add_argument("--min-s", type=float, default=10.0)
    p.add_argument("--max-s", type=float, default=40.0)
    p.add_argument("--short", action="store_true", help="6 kills, 4-10 s apart (the CI version)")
    p.add_argument("--after", type=int, default=5, help="steps trained after the last kill")
    p.add_argument("--recover-s", type=float, default=300.0, help="a kill not recovered by then fails the run")
    p.add_argument("--max-staleness", type=int, default=2)
    p.add_argument("--save-steps", type=int, default=5)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("bench_output/chaos"))
    p.add_argument("--supervisor", choices=("launcher", "plain"), default="launcher",
                   help="launcher: agrpo run's (a run id per job); plain: the same command line again, "
                        "with a config that has no run_id (as systemd or compose restart it)")
    p.add_argument("--trainer-ranks", type=int, default=1, help="trainer.num_processes (FSDP2 ranks)")
    p.add_argument("--lora", action="store_true", help="train a LoRA adapter (r 16, every linear layer), "
                   "synced alone into vLLM: kills land in adapter syncs and adapter checkpoints")
    p.add_argument("--model", default="tiny", help="agrpo demo --model (1.5b: the Qwen2.5-1.5B shape, for --gpu)")
    p.add_argument("--gpu", action="store_true", help="vLLM and the trainer on GPU 0, weights over CUDA IPC")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more config, e.g. per_device_train_batch_size=64 max_completion_length=1024")
    a = p.parse_args()
    if a.short:
        a.kills, a.min_s, a.max_s = 6, 4.0, 10.0
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
