"""Wire the rollout service together: vLLM clients, data, scheduler, engine, sender, links.

`setup()` handshakes every vLLM server, loads and tokenizes the dataset and opens the
channels to the trainer and the reward service; `run_background()` starts the links and
generates once the trainer's resume point is known. No gRPC serving here:
services/rollout/server.py serves this app (and, as its TrainerStateHook, flips health).
"""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import aiohttp
import grpc

from agrpo.services.common.channels import open_channel
from agrpo.services.common.identity import Identity
from agrpo.services.common.logging import get_logger
from agrpo.services.common.preflight import StartupError
from agrpo.services.common.timeouts import GAUGE_PERIOD_S, WEIGHT_LABEL_PERIOD_S
from agrpo.services.common.versions import lineage_from_proto
from agrpo.v1 import common_pb2

from .balancer import Balancer
from .data import PromptSet, build_prompt_set, load_rows, load_tokenizer
from .engine import Engine
from .metrics import RolloutMetrics
from .schedule import PromptScheduler
from .scoring import Scorer
from .sender import Sender, heartbeat_request
from .trainer_link import TrainerLiveness, TrainerStateHook, heartbeat_loop, watch_policy
from .vllm_client import VLLMClient

log = get_logger("rollout.app")


class RolloutApp:
    """The running service: what servicer, health and metrics report on."""

    def __init__(self, cfg, identity: Identity | None = None, trainer_state: TrainerStateHook | None = None) -> None:
        self.cfg = cfg
        self.identity = identity or Identity("rollout")
        self.metrics = RolloutMetrics()
        self.liveness = TrainerLiveness(cfg.heartbeat_stale_after_s)
        self.trainer_state: TrainerStateHook = trainer_state or _Unwatched()
        self.engine: Engine | None = None
        self.sender: Sender | None = None
        self.scheduler: PromptScheduler | None = None
        self.balancer: Balancer | None = None
        self.prompts: PromptSet | None = None
        self._tasks: list[asyncio.Task] = []
        self._resumed = asyncio.Event()
        self.finished = asyncio.Event()
        self.failure: BaseException | None = None

    # Start-up
    async def setup(self) -> None:
        """Handshake vLLM, load data, open channels; no generation yet."""
        cfg, r = self.cfg, self.cfg.rollout
        if cfg.dataset.path is None and not cfg.environment_factory:
            raise ValueError("dataset.path is not set: give a hub id, a folder, or json/csv/parquet "
                             "with dataset.data_files (or an environment_factory that writes prompts)")
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            limit=max(cfg.resolved_max_inflight_tasks, cfg.num_generations) + 8))
        clients = [VLLMClient(u, self.session, request_timeout=cfg.request_timeout, model=cfg.model,
                              endpoint=r.generate_endpoint) for u in cfg.vllm_urls]
        # The tokenizer and the rows (seconds: transformers' import) load while the servers come up,
        # in a daemon thread: a start that fails on the servers must not wait for it to exit.
        reading = in_daemon_thread(self._read_data, cfg.tokenizer or cfg.model)
        infos = await asyncio.gather(*(c.handshake(cfg.vllm_server_timeout, r.min_vllm_version)
                                       for c in clients))
        max_model_len = min(i.max_model_len for i in infos)
        self.balancer = Balancer(clients, retries=r.request_retries, backoff_s=r.server_backoff_s,
                                 backoff_max_s=r.server_backoff_max_s,
                                 on_latency=lambda u, s: self.metrics.vllm_latency.labels(u).observe(s))
        tokenizer, rows = await reading
        self.tokenizer, prompts = await asyncio.to_thread(self._prompt_set, tokenizer, rows, infos[0].model,
                                                          max_model_len)
        self.prompts = prompts
        self.metrics.skipped.set(self.prompts.skipped)
        self.scheduler = PromptScheduler(self.prompts.order, self._num_epochs())
        opts = dict(max_message_mb=r.max_message_mb, tls=cfg.tls, auth=cfg.auth)
        self.trainer_channel = open_channel(cfg.trainer.dial_address, ["agrpo.v1.TrainerService"],
                                            deadline_s=cfg.trainer.deadline_s, **opts)
        self.reward_channel = open_channel(cfg.reward.dial_address, ["agrpo.v1.RewardService"],
                                           deadline_s=r.scoring_deadline_s, **opts)
        scorer = Scorer(self.reward_channel, deadline_s=r.scoring_deadline_s, retries=r.scoring_retries)
        await self._check_reward_columns(scorer, prompts)
        self.sender = Sender(self.trainer_channel, producer_id=self.identity.instance_id,
                             prompts_per_epoch=len(self.prompts),
                             heartbeat_s=r.heartbeat_interval_s, reconnect_s=r.trainer_reconnect_s,
                             hooks=self)
        self.engine = Engine(cfg, prompts=self.prompts, tokenizer=self.tokenizer, scheduler=self.scheduler,
                             balancer=self.balancer, scorer=scorer, sender=self.sender,
                             metrics=self.metrics, producer_id=self.identity.instance_id)

    async def _check_reward_columns(self, scorer: Scorer, prompts: PromptSet) -> None:
        """A reward function that needs a column the dataset lacks fails the start, once."""
        if not self.cfg.reward_funcs or not len(prompts):
            return
        columns = set().union(*(p.columns for p in list(prompts.prompts.values())[:100]))
        try:
            await scorer.check_columns(columns)
        except grpc.aio.AioRpcError as exc:
            log.warning("reward service not reachable at start-up (%s): its columns are not checked",
                        exc.code().name)

    def _read_data(self, tokenizer_name: str | None):
        """The tokenizer (None without a name: the served model's, once known) and the rows."""
        cfg = self.cfg
        tokenizer = load_tokenizer(tokenizer_name, cfg.trust_remote_code) if tokenizer_name else None
        from .multiturn import runner as multiturn

        if cfg.dataset.path is None and cfg.environment_factory:
            return tokenizer, multiturn.environment_rows(cfg)
        return tokenizer, load_rows(cfg.dataset)

    def _prompt_set(self, tokenizer, rows: list[dict], served_model: str, max_model_len: int) -> tuple[Any, PromptSet]:
        """Render and filter the rows for these servers' max_model_len."""
        cfg = self.cfg
        tokenizer = tokenizer or load_tokenizer(served_model, cfg.trust_remote_code)
        from .multiturn import runner as multiturn

        if max_model_len <= cfg.max_completion_length:
            raise ValueError(f"max_completion_length={cfg.max_completion_length} leaves no room for a prompt in the "
                             f"server's max_model_len {max_model_len}: lower max_completion_length")
        prompts = build_prompt_set(rows, tokenizer, prompt_column=cfg.dataset.prompt_column,
                                   max_prompt_len=max_model_len - cfg.max_completion_length,
                                   chat_template_kwargs=cfg.chat_template_kwargs,
                                   seed=cfg.data_seed if cfg.data_seed is not None else cfg.seed,
                                   tools_for_row=multiturn.prompt_tools(cfg) if multiturn.enabled(cfg) else None)
        log.info("dataset: %d prompts (%d skipped as too long)", len(prompts), prompts.skipped)
        return tokenizer, prompts

    def _num_epochs(self) -> int | None:
        if self.cfg.rollout.max_epochs:
            return self.cfg.rollout.max_epochs
        return None if self.cfg.max_steps > 0 else math.ceil(self.cfg.num_train_epochs)

    async def run_background(self) -> None:
        """Start the links and, once the resume point is known, the engine."""
        ch, sender = self.trainer_channel, self.sender
        assert sender is not None  # setup() built it
        self._tasks = [
            asyncio.create_task(sender.run()),
            asyncio.create_task(watch_policy(ch, self.identity.instance_id, self.on_policy,
                                             self.liveness, self.cfg.rollout.trainer_reconnect_s)),
            asyncio.create_task(heartbeat_loop(ch, self.heartbeat, self.liveness,
                                               self.cfg.rollout.heartbeat_interval_s, self.trainer_state)),
            asyncio.create_task(self._run_engine()),
            asyncio.create_task(self._gauges()),
        ]

    async def _run_engine(self) -> None:
        await self._resumed.wait()
        engine, sender = self.engine, self.sender
        assert engine is not None and sender is not None  # setup() built them before run_background()
        engine_task = asyncio.create_task(engine.run())
        done_task = asyncio.create_task(sender.done.wait())
        try:
            await asyncio.wait([engine_task, done_task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            engine.stop()
            done_task.cancel()
            await asyncio.gather(engine_task, return_exceptions=True)
        if engine_task.done() and not engine_task.cancelled() and engine_task.exception():
            # A bug in the loop must not leave a live process that generates nothing:
            # fail the service so its supervisor restarts it (it resumes from the trainer).
            self.failure = engine_task.exception()
            if isinstance(self.failure, StartupError):
                log.error("%s", self.failure)  # a run that cannot work: one line, no restart
            else:
                log.error("generation loop failed", exc_info=self.failure)
            self.finished.set()
        elif sender.done.is_set():
            self.identity.state = common_pb2.SERVING_STATE_DONE
            self.finished.set()

    async def _gauges(self) -> None:
        """Refresh gauges every GAUGE_PERIOD_S and the servers' weight labels every WEIGHT_LABEL_PERIOD_S."""
        tick, every = 0, max(1, round(WEIGHT_LABEL_PERIOD_S / GAUGE_PERIOD_S))
        engine, sender, balancer = self.engine, self.sender, self.balancer
        # setup() built them before run_background() started this task
        assert engine is not None and sender is not None and balancer is not None
        while True:
            m = self.metrics
            m.buffered.set(sender.held)
            m.groups_inflight.set(len(engine.generating) + engine.scoring_groups)
            m.trainer_silent.set(self.liveness.silent_s)
            idle = engine.idle
            m.generation_idle.set(idle.idle_s / idle.total_s if idle.total_s else 0.0)
            m.credits.set(engine.credits_available)
            m.stale_share.set(engine.dropped_stale_share)
            if tick % every == 0:
                for s in balancer.servers:
                    if s.up:
                        s.weight_label = await s.client.weight_label() or s.weight_label
            tick += 1
            await asyncio.sleep(GAUGE_PERIOD_S)

    async def close(self) -> None:
        if self.engine:
            self.engine.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.balancer:
            await self.balancer.close()
        for name in ("trainer_channel", "reward_channel"):
            ch = getattr(self, name, None)
            if ch is not None:
                await ch.close()
        if getattr(self, "session", None):
            await self.session.close()

    # Sender hooks
    def on_resume(self, rp) -> None:
        keys = [(k.dataset_index, k.epoch) for k in rp.trained]
        assert self.scheduler is not None  # the sender (setup() builds it after the scheduler) calls this
        lost = self.scheduler.resume(rp.completed_epochs, keys)
        if lost:
            log.warning("trainer lost %d trained prompts (restart?): re-issuing them", lost)
        self.on_version(int(rp.policy_version))
        self._resumed.set()
        if self.engine:
            self.engine.wake()

    def on_group_done(self, key, ok: bool, reason: str) -> None:
        # The sender reports on groups the engine sent: setup() had built both and the scheduler.
        assert self.scheduler is not None and self.engine is not None
        if ok:
            self.scheduler.trained(key)
            self.engine.wake()
        else:
            self.engine.drop_key(key, reason)

    def on_version(self, version: int, adapter: str = "") -> None:
        if self.engine:
            self.engine.on_version(version, adapter)

    def on_lineage(self, lineage) -> None:
        if self.engine:
            self.engine.on_lineage(lineage)

    def on_policy(self, policy) -> None:
        """A PolicyVersion from WatchPolicy: its lineage first, then its number."""
        self.on_lineage(lineage_from_proto(policy.lineage))
        self.on_version(int(policy.version), policy.lora_adapter)

    def is_stale(self, version: int) -> bool:
        return self.engine.is_stale(version) if self.engine else False

    def on_credits(self) -> None:
        if self.engine:
            self.engine.wake()

    def on_heard(self) -> None:
        self.liveness.heard()

    def on_sent(self, sample) -> None:
        self.metrics.samples_sent.inc()
        distance = self.engine.lineage.distance(self.version(), sample.policy_version) if self.engine else None
        if distance is not None:  # off the lineage: it will not be trained, and has no distance
            self.metrics.staleness.observe(max(0, distance))

    def version(self) -> int:
        return self.engine.version if self.engine else 0

    def heartbeat(self):
        return heartbeat_request(self.identity, self.version())

    # Status
    def status(self) -> dict:
        """GetStatus's numbers ({} before setup); `servers` is the balancer's snapshot."""
        e, s, sch = self.engine, self.sender, self.scheduler
        if e is None:
            return {}
        assert s is not None and sch is not None and self.balancer is not None  # setup() built them before the engine
        return {"epoch": sch.epoch, "prompts_issued": sch.issued, "prompts_reissued": sch.reissued,
                "groups_in_flight": len(e.generating) + e.scoring_groups, "samples_buffered": s.held,
                "samples_sent": s.sent, "samples_acked": s.acked, "drops": dict(e.drops),
                "policy_version": e.version, "trainer_connected": s.connected,
                "trainer_silent_s": self.liveness.silent_s, "servers": self.balancer.snapshot(),
                "samples_generated": e.samples_generated, "generation_idle_s": e.idle.idle_s,
                "generation_s": e.idle.total_s}


class _Unwatched:
    """A TrainerStateHook for an app that nothing serves (tests): the change is only logged."""

    async def on_trainer_state(self, stale: bool) -> None:
        return None


def in_daemon_thread(fn, *args) -> asyncio.Future:
    """fn(*args) in a daemon thread, as a future of this event loop (asyncio.to_thread's
    threads are joined at exit, so a slow call there would hold up a failing process)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result=None, error: BaseException | None = None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result)
    threading.Thread(target=run, name="rollout-read-data", daemon=True).start()
    return future
