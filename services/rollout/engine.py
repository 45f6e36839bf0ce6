"""The rollout loop: keep vLLM busy, score groups, tag versions, hand samples to the sender.

- Issue: a group of `num_generations` requests starts when that many of the
  `max_inflight_tasks` slots are free and the held samples (generating, scoring
  and buffered for the trainer) stay within `queue_maxsize`.
- Generate: each request goes through the balancer; a request that fails on
  every retry re-issues its group. A policy bump that makes an in-flight group
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
from dataclasses import dataclass, field

from agrpo.v1 import common_pb2
from services.common.identity import now_timestamp
from services.common.logging import get_logger

from .advantage import group_advantages, group_stats
from .balancer import GenerationFailed
from .multiturn.runner import merge_env_rewards
from .scoring import GroupScores, ScoringFailed, build_request
from .vllm_client import Completion, SamplingConfig

log = get_logger("rollout.engine")


def label_version(label: str, fallback: int) -> int:
    """A vLLM weight label as a policy version: "default" is 0, else int(label)."""
    if label == "default":
        return 0
    try:
        return int(label)
    except ValueError:
        return fallback


@dataclass
class Group:
    """One prompt being generated and scored."""

    key: tuple[int, int]
    group_id: str
    dispatch_version: int
    started: float = field(default_factory=time.monotonic)
    completions: list[Completion] = field(default_factory=list)
    version: int = 0
    generated_at: float = 0.0
    task: asyncio.Task | None = None
    slots: int = 0
    """In-flight slots this group still holds (one per unfinished request)."""


async def gather_or_cancel(coros) -> list:
    """Results of all coroutines, or the first failure with the others cancelled (a group
    is all or nothing: a partial group cannot get fair advantages)."""
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


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
        self.inflight_requests = 0
        self.generating: dict[str, Group] = {}
        self.scoring_groups = 0
        self.score_queue: asyncio.Queue[Group] = asyncio.Queue()
        self.drops: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._tok_window: list[tuple[float, int]] = []
        self.multiturn = None  # tools / environment_factory: conversations instead of completions
        if cfg.tools or cfg.environment_factory:
            from .multiturn.runner import MultiTurn
            self.multiturn = MultiTurn(cfg, tokenizer, self)

    # Capacity
    @property
    def pipeline_samples(self) -> int:
        return (len(self.generating) + self.scoring_groups) * self.G

    def _has_capacity(self) -> bool:
        slots = self.inflight_requests + self.G <= max(self.max_inflight, self.G)
        held = self.sender.held + self.pipeline_samples + self.G <= max(self.cfg.queue_maxsize, self.G)
        return slots and held

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

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
                        await asyncio.wait_for(self._wake.wait(), 0.5)
                    except asyncio.TimeoutError:
                        pass
                    continue
                self._launch(key)
        finally:
            for t in workers:
                t.cancel()
            for g in list(self.generating.values()):
                g.task.cancel()
            await asyncio.gather(*workers, *(g.task for g in self.generating.values()),
                                 return_exceptions=True)

    def _launch(self, key: tuple[int, int]) -> None:
        gid = f"{key[1]}-{key[0]}-{uuid.uuid4().hex[:8]}"
        group = Group(key, gid, self.version, slots=self.G)
        self.inflight_requests += self.G  # reserved now, released as each request ends
        self.generating[gid] = group
        self.metrics.prompts_issued.inc()
        group.task = asyncio.create_task(self._generate_group(group))

    async def _generate_group(self, group: Group) -> None:
        prompt = self.prompts[group.key[0]]
        try:
            group.completions = await (self.multiturn.gather(prompt, group) if self.multiturn
                                       else self._gather(prompt.prompt_ids, group))
        except GenerationFailed as exc:
            log.warning("group %s failed: %s; re-issuing its prompt", group.group_id, exc)
            self._drop(group, "generation_failed")
            return
        except asyncio.CancelledError:
            return  # aborted as stale or at shutdown; whoever cancelled accounted for it
        finally:
            self.generating.pop(group.group_id, None)
            self._release(group, group.slots)
        self._tag(group)
        group.generated_at = time.monotonic()
        if self.version - group.version > self.cfg.max_staleness:
            self._drop(group, "stale_generated")
            return
        self.scoring_groups += 1
        self.score_queue.put_nowait(group)

    async def _gather(self, prompt_ids: list[int], group: Group) -> list[Completion]:
        """All G completions, or the first failure with the other requests cancelled."""
        return await gather_or_cancel([self._one_request(prompt_ids, f"{group.group_id}-{i}", group)
                                       for i in range(self.G)])

    async def _one_request(self, prompt_ids: list[int], request_id: str, group: Group) -> Completion:
        try:
            out = await self.balancer.generate(prompt_ids, self.sampling, request_id)
        finally:
            self._release(group, 1)
        self._count_tokens(len(out.token_ids))
        return out

    def _release(self, group: Group, n: int) -> None:
        """Give back up to n of the group's in-flight slots."""
        n = min(n, group.slots)
        group.slots -= n
        self.inflight_requests -= n
        self.metrics.inflight.set(self.inflight_requests)
        if n:
            self.wake()

    def _tag(self, group: Group) -> None:
        if self.multiturn:
            group.version = self.multiturn.tag(group.completions, group.dispatch_version)
            return
        versions = [label_version(label, group.dispatch_version)
                    for c in group.completions for label, s, e in c.spans if e > s]
        group.version = min(versions) if versions else group.dispatch_version

    def _drop(self, group: Group, reason: str, delay_s: float = 0.0) -> None:
        self.drops[reason] = self.drops.get(reason, 0) + 1
        self.metrics.drops.labels(reason).inc()
        self.metrics.reissued.inc()
        self.scheduler.failed(group.key, delay_s)
        self.wake()

    # Policy versions
    def on_version(self, version: int) -> None:
        """A newer policy: abort in-flight groups it makes too stale, sweep the send buffer."""
        if version <= self.version:
            return
        self.version = version
        self.metrics.policy_version.set(version)
        log.info("policy version %d", version, extra={"policy_version": version})
        stale = [g for g in self.generating.values()
                 if version - g.dispatch_version > self.cfg.max_staleness]
        for g in stale:
            g.task.cancel()
            self.generating.pop(g.group_id, None)
            self._release(g, g.slots)
            self._drop(g, "stale_inflight")
        if stale:
            ids = [f"{g.group_id}-{i}" for g in stale for i in range(self.G)]
            asyncio.get_running_loop().create_task(self.balancer.abort(ids))
        self.sender.sweep_stale()
        self.wake()

    # Scoring
    async def _score_worker(self) -> None:
        while True:
            group = await self.score_queue.get()
            try:
                await self._score_group(group)
            except Exception:  # noqa: BLE001 - one bad group must not stop scoring
                log.exception("scoring group %s crashed; re-issuing", group.group_id)
                self._drop(group, "scoring_error")
            finally:
                self.scoring_groups -= 1
                self.wake()

    async def _score_group(self, group: Group) -> None:
        prompt = self.prompts[group.key[0]]
        if self.multiturn:
            texts, completions, ids = self.multiturn.score_inputs(group, prompt)
        else:
            ids = [c.token_ids for c in group.completions]
            texts = [self.tokenizer.decode(t, skip_special_tokens=True) for t in ids]
            completions = ([[{"role": "assistant", "content": t}] for t in texts]
                           if prompt.conversational else texts)
        request = build_request(group.group_id, prompt.prompt, completions, ids, prompt.columns)
        t0 = time.monotonic()
        wait_ms = (t0 - group.generated_at) * 1000  # queued for scoring
        try:
            scores = (GroupScores([math.nan] * len(ids), {}) if self.multiturn and not self.cfg.reward_funcs
                      else await self.scorer.score(request))  # an environment may own the reward
        except ScoringFailed as exc:
            log.warning("group %s: %s; re-issuing later", group.group_id, exc)
            self._drop(group, "scoring_failed", self.cfg.rollout.reissue_delay_s)
            return
        scoring_ms = (time.monotonic() - t0) * 1000
        self.metrics.scoring_latency.observe(scoring_ms / 1000)
        if self.version - group.version > self.cfg.max_staleness:
            self._drop(group, "stale_scored")
            return
        if self.multiturn:
            totals, comps = merge_env_rewards(scores.totals, scores.components, group.completions)
            samples = self.multiturn.samples(group, prompt, texts, totals, comps, scoring_ms, wait_ms)
            if not samples:
                self._drop(group, "no_trained_tokens")
                return
        else:
            samples = self._samples(group, prompt, texts, scores, scoring_ms, wait_ms)
        self.sender.add_group(group.key, group.version, samples)

    def _samples(self, group, prompt, texts, scores, scoring_ms, wait_ms) -> list:
        rewards = scores.totals
        adv = group_advantages(rewards)
        mean, std = group_stats(rewards)
        if not math.isnan(mean):
            self.metrics.reward_mean.set(mean)
        P = len(prompt.prompt_ids)
        send_text = self.cfg.rollout.send_text
        out = []
        for i, c in enumerate(group.completions):
            gen_s = max(c.latency_s, 1e-9)
            metrics = {"reward": rewards[i], "reward_std": std,
                       "generation_tok_per_s": len(c.token_ids) / gen_s,
                       "scoring_time_ms": scoring_ms, "wait_scoring_ms": wait_ms,
                       "buffer_qsize": float(self.sender.held)}
            metrics.update({f"rewards/{k}": v[i] for k, v in scores.components.items()})
            if not math.isnan(rewards[i]):
                self.metrics.reward.observe(rewards[i])
            spans = [common_pb2.VersionSpan(policy_version=label_version(lb, group.dispatch_version),
                                            start=P + s, end=P + e) for lb, s, e in c.spans if e > s]
            out.append(common_pb2.RolloutSample(
                sample_id=f"{group.group_id}-{i}", group_id=group.group_id,
                prompt_key=common_pb2.PromptKey(dataset_index=group.key[0], epoch=group.key[1]),
                policy_version=group.version, version_spans=spans,
                input_ids=prompt.prompt_ids + c.token_ids,
                completion_mask=[0] * P + [1] * len(c.token_ids),
                behavior_logprobs=[0.0] * P + c.logprobs, prompt_length=P,
                advantage=adv[i], reward=rewards[i],
                reward_components={k: v[i] for k, v in scores.components.items()},
                metrics=metrics, generation_index=i,
                prompt_text=prompt.prompt_text if send_text else "",
                completion_text=texts[i] if send_text else "",
                created_at=now_timestamp(), producer_id=self.producer_id))
        return out

    # Throughput
    def _count_tokens(self, n: int) -> None:
        now = time.monotonic()
        self.metrics.generated_tokens.inc(n)
        self._tok_window.append((now, n))
        while self._tok_window and now - self._tok_window[0][0] > 10.0:
            self._tok_window.pop(0)
        span = now - self._tok_window[0][0] if len(self._tok_window) > 1 else 0.0
        if span > 0:
            self.metrics.generation_tok_s.set(sum(k for _, k in self._tok_window) / span)
