"""The trainer on N ranks (torchrun): rank 0 serves and plans, every rank computes.

Rank 0 runs the whole service (gRPC, ledger, audit, metrics, pacing, weight sync). Each
thing the ranks must do together is one command rank 0 broadcasts to the others, which
`follow()` in a loop:

    build   load the model (or a checkpoint's shards), shard it with FSDP2
    step    forward/backward of the step's micro-batches (each rank trains its rows)
    weights gather the full weights for a sync, one FSDP unit at a time (rank 0 keeps them,
            then sends them to vLLM alone: nothing interleaves with the gather)
    adapter the same for a LoRA model's adapter alone (an adapter-only sync)
    save    write a checkpoint (torch.distributed.checkpoint shards + rank 0's files)
    stop    exit

Commands travel through the group's key-value store, not a collective: a follower may wait
for the next one as long as the trainer idles (rollout slow, a sync, a quiet queue), while
every collective the command starts has `trainer.collective_timeout_s`. A rank that hangs
inside a command becomes an error on rank 0; a rank that dies ends the group (torchrun
stops the others), the trainer exits non-zero and its supervisor restarts it, resuming from
the last checkpoint. A follower that got a stop signal exits once rank 0 stays silent for
the collective timeout. One rank: the same calls run locally.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, cast

from agrpo.services.common.logging import get_logger
from agrpo.services.common.timeouts import RANK_BEAT_S

if TYPE_CHECKING:
    from collections.abc import Callable

    from .engine import Engine

log = get_logger("trainer.ranks")


@dataclass(frozen=True)
class World:
    """This process's place in the trainer: rank, world size, local GPU."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def leader(self) -> bool:
        return self.rank == 0


def world_from_env() -> World:
    """torchrun's RANK / WORLD_SIZE / LOCAL_RANK (one rank without them)."""
    return World(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                 int(os.environ.get("LOCAL_RANK", "0")))


def ranks_on_this_node(num_processes: int) -> int:
    """trainer.num_processes, where 0 means one rank per visible GPU (1 without GPUs)."""
    if num_processes:
        return num_processes
    import torch

    return max(torch.cuda.device_count(), 1)


def run_ranks(n: int) -> None:
    """`agrpo trainer` with more than one rank outside torchrun: become torchrun running this
    same command, n ranks per node. Same pid, so the signals of agrpo run, compose or
    Kubernetes reach torchrun, which passes them to the ranks. One node: --standalone; more
    (PET_NNODES): torchrun takes the node rank and rank 0's address from its PET_* variables."""
    nodes = int(os.environ.get("PET_NNODES", "1") or "1")
    log.info("starting %d trainer ranks under torchrun (node %s of %d)", n, os.environ.get("PET_NODE_RANK", "0"), nodes)
    where = [] if nodes > 1 else ["--standalone"]
    args = sys.argv[1:]
    if args[:1] == ["trainer"]:  # started as `agrpo trainer ...` rather than `python -m agrpo.services.trainer`
        args = args[1:]
    argv = [sys.executable, "-m", "torch.distributed.run", *where, "--nproc_per_node", str(n),
            "-m", "agrpo.services.trainer", *args]
    os.execv(sys.executable, argv)


def sharded(cfg) -> bool:
    """Whether the engine runs under FSDP2 even on one rank (trainer.fsdp or cpu_offload)."""
    return cfg.trainer.fsdp or cfg.trainer.cpu_offload


def init(world: World, timeout_s: float, use_cuda: bool, fsdp: bool = False) -> None:
    """Join the process group (NCCL on GPUs, gloo on CPU), every collective timed out. One
    rank needs a group only to shard (`sharded(cfg)`): then it is a group of one."""
    if world.size == 1 and not fsdp:
        return
    _die_with_launcher()
    import torch
    import torch.distributed as dist

    if use_cuda:
        torch.cuda.set_device(world.local_rank)
    if world.size == 1:
        from agrpo.services.common.ports import free_port

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=timeout_s))
    log.info("rank %d of %d joined (%s)", world.rank, world.size, "nccl" if use_cuda else "gloo")


def leave(code: int) -> int:
    """Destroy the process group before the interpreter exits: left to finalization, gloo's
    worker threads can abort the process (SIGABRT, "terminate called without an active
    exception") after a clean stop. Only on a clean exit: a broken group may not tear down."""
    dist = sys.modules.get("torch.distributed")
    if code == 0 and dist is not None and dist.is_initialized():
        dist.destroy_process_group()
    return code


def _die_with_launcher() -> None:
    """Under torchrun each rank has a session of its own, so a SIGKILL of the launcher's
    process group (agrpo run's second Ctrl-C) misses it: it dies with its parent instead."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        from agrpo.services.common.lifetime import die_with_parent

        die_with_parent()


class Commands:
    """Numbered commands in the process group's store: rank 0 posts, the others take them in
    order. Posting never blocks, so rank 0 can always say `stop`, even to ranks that are gone."""

    def __init__(self, store=None) -> None:
        from torch.distributed.distributed_c10d import _get_default_store

        self.store = store if store is not None else _get_default_store()
        self.sent = self.taken = 0

    def post(self, command: tuple) -> None:
        self.store.set(f"agrpo/cmd/{self.sent}", pickle.dumps(command))
        if self.sent:  # every command runs a collective, so all ranks took the one before
            self.store.delete_key(f"agrpo/cmd/{self.sent - 1}")
        self.sent += 1

    def take(self, rank: int, give_up) -> tuple | None:
        """The next command; polls (1 ms, backing off to 50 ms) with no timeout of its own:
        `give_up()` says when to stop waiting (None then). Records which one this rank is in."""
        key, pause, beat = f"agrpo/cmd/{self.taken}", 0.001, 0.0
        while not self.store.check([key]):
            if give_up():
                return None
            if time.monotonic() - beat > RANK_BEAT_S:  # rank 0's health watches this counter
                self.store.add(f"agrpo/beat/{rank}", 1)
                beat = time.monotonic()
            time.sleep(pause)
            pause = min(pause * 1.5, 0.05)
        command = pickle.loads(self.store.get(key))
        self.store.set(f"agrpo/at/{rank}", str(self.taken))
        self.taken += 1
        return command

    def behind(self, world_size: int) -> list[int]:
        """Ranks that never started the last command posted (gone, or stuck before it)."""
        late = []
        for rank in range(1, world_size):
            try:
                at = int(self.store.get(f"agrpo/at/{rank}")) if self.store.check([f"agrpo/at/{rank}"]) else -1
            except RuntimeError:
                at = -1
            if at < self.sent - 1:
                late.append(rank)
        return late


    def beats(self, world_size: int) -> dict[int, int]:
        """Each follower's heartbeat count (it beats while it waits for a command)."""
        return {rank: self.store.add(f"agrpo/beat/{rank}", 0) for rank in range(1, world_size)}


class RanksFailed(RuntimeError):
    """A command the ranks run together failed: names the command and the ranks behind."""


class RankGroup:
    """Rank 0's handle on the others: each method is one command every rank carries out."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.engine: Engine | None = None  # rank 0's, once build() ran
        self._commands: Commands | None = None  # _send() opens it (more than one rank)
        self._busy = False  # a command runs: the followers are in it, not beating
        self._beats: dict[int, tuple[int, float]] = {}  # rank -> (count, when it last changed)

    def _send(self, *command) -> None:
        if self.world.size > 1:
            self._commands = self._commands or Commands()
            self._commands.post(command)

    def _together(self, name: str, run, *args):
        """Post command `name`, run rank 0's part; a failure (a rank died, a collective timed
        out) becomes one RanksFailed line naming the command and the ranks behind it."""
        self._send(name, *args)
        t0, self._busy = time.monotonic(), True
        try:
            return run()
        except Exception as exc:  # gloo/NCCL raise RuntimeError and friends
            if self.world.size == 1:
                raise
            assert self._commands is not None  # _send() opened it: more than one rank
            behind = self._commands.behind(self.world.size)
            raise RanksFailed(f"trainer ranks: {name!r} failed after {time.monotonic() - t0:.1f} s "
                              f"(ranks behind: {behind or 'none'}): {str(exc).splitlines()[0][:300]}") from exc
        finally:
            self._busy = False
            self._beats.clear()  # the followers just worked: count their silence from now

    def silent(self, max_age_s: float) -> list[int]:
        """Followers that waited for a command without beating for `max_age_s` (hung, or
        stopped); [] while a command runs or before the first one."""
        if self.world.size == 1 or self._commands is None or self._busy:
            return []
        now, late = time.monotonic(), []
        for rank, count in self._commands.beats(self.world.size).items():
            seen, since = self._beats.get(rank, (None, now))
            if count != seen:
                self._beats[rank] = (count, now)
            elif now - since > max_age_s:
                late.append(rank)
        return late

    def build(self, cfg, model_path: str, shards: str | None):
        """Every rank loads the model and shards it; returns rank 0's (engine, tokenizer, device)."""
        built = self._together("build", lambda: build(cfg, model_path, shards, self.world), model_path, shards)
        self.engine = built[0]
        return built

    def train_step(self, batches, staleness: dict[int, int] | None) -> dict:
        # get(), never None: `staleness` has the version of every sample in `batches` (TrainerLoop)
        lookup = cast("Callable[[int], int]", staleness.get) if staleness is not None else None
        engine = self.engine
        assert engine is not None  # the trainer steps only after build()
        return self._together("step", lambda: engine.train_step(batches, lookup), batches, staleness)

    def weights(self, dtype):
        """The full (HF-named) weights on rank 0, gathered unit by unit on every rank."""
        return self._together("weights", lambda: gather_weights(self.engine, dtype), dtype)

    def adapter(self, dtype):
        """The LoRA adapter's tensors on rank 0, gathered whole on every rank when sharded."""
        engine = self.engine
        assert engine is not None  # a sync comes after build()
        if not self.sharded:
            return gather_adapter(engine, dtype)
        return self._together("adapter", lambda: gather_adapter(engine, dtype), dtype)

    @property
    def sharded(self) -> bool:
        return self.engine is not None and _sharded(self.engine)

    def save_shards(self, shards_dir) -> list | None:
        """Every rank writes its DCP shards into `shards_dir`; the full weights on rank 0."""
        return self._together("save", lambda: save_shards(self.engine, str(shards_dir)), str(shards_dir))

    def stop(self) -> None:
        self._send("stop")


def build(cfg, model_path: str, shards: str | None, world: World):
    """The engine of one rank (FSDP2 from 2 ranks up, or `sharded(cfg)`); a checkpoint's
    shards (model, optimizer; scheduler and RNG from its optimizer.pt) loaded if given.
    DCP reshards on load, so a checkpoint resumes at another world size too."""
    from pathlib import Path

    from . import checkpoint
    from .engine_factory import build_engine
    from .fsdp import build_sharded_engine

    built = build_engine(cfg, model_path) if world.size == 1 and not sharded(cfg) else \
        build_sharded_engine(cfg, model_path)
    if shards:
        load_shards(built[0], shards)
        checkpoint.restore_optimizer(Path(shards).parent, built[0].optimizer, built[0].scheduler)
    return built


def _sharded(engine) -> bool:
    from .engine import _sharded as is_sharded

    return is_sharded(engine.root)


def gather_weights(engine, dtype):
    from .fsdp import weights_for_sync

    return weights_for_sync(engine, dtype, dst=0)


def gather_adapter(engine, dtype):
    from .fsdp import adapter_for_sync

    return adapter_for_sync(engine, dtype, dst=0)


def _what_trains(loading: bool = False):
    """DCP options: shards hold what trains and its optimizer state; a LoRA model's frozen base
    comes from the base model's files, not checkpoint bytes (full fine-tuning freezes nothing).
    Loading, the frozen keys are absent by design (dcp.load still fails on a missing trained one)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=not loading)


def save_shards(engine, shards_dir: str):
    """DCP shards of model and optimizer (every rank); returns on rank 0 what the checkpoint's
    model files hold (`fsdp.weights_to_save`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from .fsdp import weights_to_save

    model_sd, optim_sd = get_state_dict(engine.root, engine.optimizer, options=_what_trains())
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=shards_dir)
    return weights_to_save(engine, dst=0)


def load_shards(engine, shards_dir: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(engine.root, engine.optimizer, options=_what_trains())
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=shards_dir)
    set_state_dict(engine.root, engine.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=_what_trains(loading=True))


def follow(cfg, world: World) -> int:
    """Ranks > 0: carry out rank 0's commands until `stop` (or the group breaks). A stop
    signal is rank 0's to act on (it finishes the step with us, then says stop); if rank 0
    stays silent for the collective timeout after one, this rank exits."""
    signalled: list[float] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: signalled.append(time.monotonic()))

    def give_up() -> bool:
        return bool(signalled) and time.monotonic() - signalled[0] > cfg.trainer.collective_timeout_s

    commands, engine = Commands(), None
    while True:
        command = commands.take(world.rank, give_up)
        if command is None:
            log.warning("rank %d: stopped, and rank 0 is silent: exiting", world.rank)
            return 1
        name, *args = command
        if name == "build":
            engine = build(cfg, args[0], args[1], world)[0]
        elif name == "step":
            batches, staleness = args
            assert engine is not None  # rank 0 sends "build" before any "step"
            engine.train_step(batches, staleness.get if staleness is not None else None)
        elif name == "weights":
            gather_weights(engine, args[0])
        elif name == "adapter":
            gather_adapter(engine, args[0])
        elif name == "save":
            save_shards(engine, args[0])
        elif name == "stop":
            log.info("rank %d: stop", world.rank)
            return 0
