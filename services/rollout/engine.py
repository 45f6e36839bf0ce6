"""The rollout loop: keep vLLM busy, score groups, tag versions, hand samples to the sender.

- Issue: a group of `num_generations` requests starts when one of the
  `max_inflight_tasks` request slots is free and the trainer's credits cover the group;
  each request takes a slot as one frees (TRL's slots: one per request), so vLLM keeps
  max_inflight_tasks requests while there is work, not up to G - 1 fewer. Every sample
  generating, scoring or waiting to be sent holds a credit, so generation runs at most
  max_staleness versions ahead of training (the pacing rule, services/trainer/pacing.py
  and docs/architecture.md).
- Generate: a strategy runs the group (single_turn.py: G completions;
  multiturn/runner.py: G conversations with tools or environments) through the
  balancer; a request that fails on every retry re-issues its group. A policy bump that makes an in-flight group
  too stale (version - dispatch version > max_staleness) aborts it and
  re-issues its prompt.
- Tag: a group's policy version is the oldest version that produced one of its
  tokens (vLLM weight_versions spans; else the version known at dispatch).
- Score: off the generation path, `scoring_concurrency` at a time; advantages
  per group; a group that cannot be scored is re-issued later.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import Counter

from agrpo.services.common.logging import get_logger
from agrpo.services.common.metrics import IdleClock
from agrpo.services.common.preflight import StartupError
from agrpo.services.common.timeouts import ISSUE_RECHECK_S
from agrpo.services.common.versions import Lineage, adapter_version

from .balancer import GenerationFailed
from .groups import GenerationContext, Group
from .metrics import RateWindow
from .samples import ScoredGroup, build_samples
from .scoring import GroupScores, ScoringFailed, build_request
from .vllm_client import SamplingConfig, VLLMIncompatible

log = get_logger("rollout.engine")
PERMANENT_REFUSALS = 3
"""A prompt that vLLM or the reward service refuses this many times as a bad request (not an
outage) stops the run with the reason, instead of being re-issued forever."""


def build_strategy(cfg, tokenizer, ctx: GenerationContext):
    """Conversations (tools / environment_factory) or single completions."""
    from .multiturn import runner as multiturn

    if multiturn.enabled(cfg):
        return multiturn.MultiTurn(cfg, tokenizer, ctx)
    from .single_turn import SingleTurn

    return SingleTurn(cfg, tokenizer, ctx)


class Engine:
    """Generation, scoring and version tagging; the sender and scheduler hold the rest."""

    def __init__(self, cfg, *, prompts, tokenizer, scheduler, balancer, scorer, sender, metrics,
                 producer_id: str) -> None:
        self.cfg = cfg
        self.prompts = prompts
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.balancer = balancer
        self.scorer = scorer
        self.sender = sender
        self.metrics = metrics
        self.producer_id = producer_id
        self.G = cfg.num_generations
        self.max_inflight = cfg.resolved_max_inflight_tasks
        self.sampling = SamplingConfig(cfg.max_completion_length, cfg.temperature, cfg.top_p, cfg.top_k,
                                       cfg.min_p, cfg.repetition_penalty)
        self.version = 0
        self.adapter = ""  # the newest LoRA adapter a server holds (adapter-only sync), else ""
        self.lineage = Lineage()  # the trainer's: which versions still name weights, and how far apart
        self.inflight_requests = 0
        self.generating: dict[str, Group] = {}
        self.scoring_groups = 0
        self.score_queue: asyncio.Queue[Group] = asyncio.Queue()
        self.drops: Counter = Counter()  # groups dropped (their prompt re-issued), by reason
        self.samples_generated = 0
        self.refused: Counter = Counter()  # prompt key -> refusals by vLLM or the reward service
        self.fatal: StartupError | None = None
        self.idle = IdleClock()  # no request in flight: vLLM has nothing of ours to do
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._tok_rate = RateWindow(10.0)
        self.slots = max(self.max_inflight, self.G)  # a group of G always fits
        self.strategy = build_strategy(cfg, tokenizer, GenerationContext(
            balancer, self.sampling, self.G, self._release, asyncio.Semaphore(self.slots), self._count_tokens,
            lambda: self.adapter))

    # Capacity
    @property
    def pipeline_samples(self) -> int:
        return (len(self.generating) + self.scoring_groups) * self.G

    @property
    def dropped_stale_share(self) -> float:
        """Generated samples later dropped as stale (here or at the trainer) / generated."""
        stale = sum(n for reason, n in self.drops.items() if reason.startswith("stale") and reason != "stale_inflight")
        return stale * self.G / self.samples_generated if self.samples_generated else 0.0

    @property
    def credits_available(self) -> int:
        """Trainer credits not committed to a group generating, scoring or waiting to be sent."""
        return self.sender.credits - self.sender.unsent_count - self.pipeline_samples

    def _has_capacity(self) -> bool:
        """Slots free for the group's first request (its others wait for theirs; all G when
        they go as one request) and credits for all G."""
        return (self.inflight_requests + self.strategy.slots_to_start <= self.slots
                and self.credits_available >= self.G)

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def halt(self, error: StartupError) -> None:
        """The run cannot go on: stop generating; `run` raises `error` once it has wound down."""
        self.fatal = error
        self.stop()

    # Issue loop
    async def run(self) -> None:
        """Issue groups until stopped; scoring workers run beside it."""
        workers = [asyncio.create_task(self._score_worker())
                   for _ in range(self.cfg.rollout.scoring_concurrency)]
        try:
            while not self._stop.is_set():
                key = self.scheduler.next() if self._has_capacity() else None
                if key is None:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), ISSUE_RECHECK_S)
                    except TimeoutError:
                        pass
                    continue
                self._launch(key)
        finally:
            for t in workers:
                t.cancel()
            for g in list(self.generating.values()):
                assert g.task is not None  # _launch() sets it as it adds the group
                g.task.cancel()
            await asyncio.gather(*workers, *(g.task for g in self.generating.values()),
                                 return_exceptions=True)
        if self.fatal is not None:
            raise self.fatal

    def _launch(self, key: tuple[int, int]) -> None:
        gid = f"{key[1]}-{key[0]}-{uuid.uuid4().hex[:8]}"
        group = Group(key, gid, self.version, slots=self.G)
        self.inflight_requests += self.G  # reserved now, released as each request ends
        self.idle.start(busy=True)
        self.idle.busy(True)
        self.generating[gid] = group
        self.metrics.prompts_issued.inc()
        group.task = asyncio.create_task(self._generate_group(group))

    async def _generate_group(self, group: Group) -> None:
        prompt = self.prompts[group.key[0]]
        try:
            group.completions = await self.strategy.generate(prompt, group)
        except GenerationFailed as exc:
            fatal = self._refused_again(group, "vLLM", exc) if exc.refused else None
            if fatal is not None:  # the run cannot finish this epoch: stop with vLLM's reason
                self.halt(fatal)
                return
            log.warning("group %s failed: %s; re-issuing its prompt", group.group_id, exc)
            self._drop(group, "generation_failed")
            return
        except asyncio.CancelledError:
            return  # aborted as stale or at shutdown; whoever cancelled accounted for it
        except VLLMIncompatible as exc:  # the server cannot do what the config asks: stop, say why
            self.halt(StartupError(str(exc)))
            return
        finally:
            self.generating.pop(group.group_id, None)
            self._release(group, group.slots)
        group.version = self.strategy.tag(group)
        group.generated_at = time.monotonic()
        self.samples_generated += len(group.completions)
        self.metrics.samples_generated.inc(len(group.completions))
        if not self.lineage.on_lineage(self._versions(group)):
            self._drop(group, "off_lineage")
            return
        if self.is_stale(group.version):
            self._drop(group, "stale_generated")
            return
        self.scoring_groups += 1
        self.score_queue.put_nowait(group)

    def _release(self, group: Group, n: int) -> None:
        """Give back up to n of the group's in-flight slots."""
        n = min(n, group.slots)
        group.slots -= n
        self.inflight_requests -= n
        self.idle.busy(self.inflight_requests > 0)
        self.metrics.inflight.set(self.inflight_requests)
        if n:
            self.wake()

    def _drop(self, group: Group, reason: str, delay_s: float = 0.0) -> None:
        self.drop_key(group.key, reason, delay_s)

    def drop_key(self, key: tuple[int, int], reason: str, delay_s: float = 0.0) -> None:
        """Count a dropped group and re-issue its prompt (after `delay_s`)."""
        self.drops[reason] += 1
        self.metrics.drops.labels(reason).inc()
        self.metrics.reissued.inc()
        self.scheduler.failed(key, delay_s)
        self.wake()

    # Policy versions
    def is_stale(self, version: int) -> bool:
        """Past max_staleness at the current version, or off the trainer's lineage."""
        return self.lineage.stale(self.version, version, self.cfg.max_staleness)

    def _versions(self, group: Group) -> list[int]:
        """Every version that produced a token of the group, and its dispatch version."""
        return [group.dispatch_version, *(v for row in self.strategy.rows(group, self.prompts[group.key[0]])
                                          for v, _, _ in row.spans)]

    def on_lineage(self, lineage: Lineage) -> None:
        """The trainer resumed (a restart): what versions after its checkpoint produced is
        never trained. Groups dispatched at such versions are aborted, held ones dropped."""
        if lineage == self.lineage:
            return
        self.lineage = lineage
        log.warning("trainer lineage changed (a restart): %s", lineage.segments)
        self._abort([g for g in self.generating.values() if lineage.index(g.dispatch_version) is None],
                    "off_lineage")
        self.sender.drop_off_lineage(lineage)

    def on_version(self, version: int, adapter: str = "") -> None:
        """A newer policy: abort in-flight groups it makes too stale, sweep the send buffer.
        `adapter` (adapter-only LoRA sync) is the newest one the servers hold, which may be of an
        older version: the trainer mints a version before its adapter is in vLLM. Requests name
        the newest adapter heard of (naming none would sample the base model)."""
        if adapter and (not self.adapter or adapter_version(adapter) >= adapter_version(self.adapter)):
            self.adapter = adapter
        if version <= self.version:
            return
        self.version = version
        self.metrics.policy_version.set(version)
        log.info("policy version %d", version, extra={"policy_version": version})
        self._abort([g for g in self.generating.values() if self.is_stale(g.dispatch_version)], "stale_inflight")
        self.sender.sweep_stale()
        self.wake()

    def _abort(self, stale: list[Group], reason: str) -> None:
        """Cancel in-flight groups at vLLM and re-issue their prompts."""
        for g in stale:
            assert g.task is not None  # every generating group has one (_launch())
            g.task.cancel()
            self.generating.pop(g.group_id, None)
            self._release(g, g.slots)
            self._drop(g, reason)
        if stale:
            ids = [g.request_id(i) for g in stale for i in range(self.G)]
            asyncio.get_running_loop().create_task(self.balancer.abort(ids))

    # Scoring
    async def _score_worker(self) -> None:
        while True:
            group = await self.score_queue.get()
            try:
                await self._score_group(group)
            except StartupError as exc:  # the run cannot work: stop generating, fail the service
                self.halt(exc)
                return
            except Exception:  # one bad group must not stop scoring
                log.exception("scoring group %s crashed; re-issuing", group.group_id)
                self._drop(group, "scoring_error")
            finally:
                self.scoring_groups -= 1
                self.wake()

    async def _score_group(self, group: Group) -> None:
        prompt, strategy = self.prompts[group.key[0]], self.strategy
        texts, completions, ids = strategy.score_inputs(group, prompt)
        request = build_request(group.group_id, prompt.prompt, completions, ids, prompt.columns)
        t0 = time.monotonic()
        wait_ms = (t0 - group.generated_at) * 1000  # queued for scoring
        try:
            scores = (await self.scorer.score(request) if strategy.needs_reward_service
                      else GroupScores([math.nan] * len(ids), {}))
        except ScoringFailed as exc:
            self._scoring_failed(group, exc)
            return
        scoring_ms = (time.monotonic() - t0) * 1000
        self.metrics.scoring_latency.observe(scoring_ms / 1000)
        if not self.lineage.on_lineage(self._versions(group)):
            self._drop(group, "off_lineage")
            return
        if self.is_stale(group.version):
            self._drop(group, "stale_scored")
            return
        rewards, components = strategy.rewards(group, scores)
        scored = ScoredGroup(rewards, components, scoring_ms, wait_ms, scores.errors)
        self._observe_rewards(scored)
        samples = build_samples(group, prompt, strategy.rows(group, prompt), scored, texts,
                                send_text=self.cfg.rollout.send_text, producer_id=self.producer_id,
                                buffered=self.sender.held)
        if not samples:
            self._drop(group, "no_trained_tokens")
            return
        self.sender.add_group(group.key, group.version, samples)

    def _scoring_failed(self, group: Group, exc: ScoringFailed) -> None:
        """Re-issue later; a prompt the reward service refuses again and again stops the run."""
        fatal = self._refused_again(group, "the reward service", exc) if exc.permanent else None
        if fatal is not None:
            raise fatal
        log.warning("group %s: %s; re-issuing later", group.group_id, exc)
        self._drop(group, "scoring_failed", self.cfg.rollout.reissue_delay_s)

    def _refused_again(self, group: Group, by: str, exc: Exception) -> StartupError | None:
        """Count one more refusal of the group's prompt; past PERMANENT_REFUSALS, the error
        that stops the run."""
        self.refused[group.key] += 1
        if self.refused[group.key] < PERMANENT_REFUSALS:
            return None
        return StartupError(f"{by} refused prompt {group.key[0]} (epoch {group.key[1]}) "
                            f"{PERMANENT_REFUSALS} times: {exc}")

    def _observe_rewards(self, scored: ScoredGroup) -> None:
        if not math.isnan(scored.mean):
            self.metrics.reward_mean.set(scored.mean)
        for r in scored.rewards:
            if not math.isnan(r):
                self.metrics.reward.observe(r)

    # Throughput
    def _count_tokens(self, n: int) -> None:
        self.metrics.generated_tokens.inc(n)
        rate = self._tok_rate.add(time.monotonic(), n)
        if rate is not None:
            self.metrics.generation_tok_s.set(rate)
