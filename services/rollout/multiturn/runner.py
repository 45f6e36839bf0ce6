"""The engine's multi-turn path: G conversations per group, rewards, rows -> samples.

Used only when the config sets `tools` or `environment_factory`. A group's G
conversations run concurrently; each holds one in-flight slot until it ends.
Environment rewards (`get_reward`) become reward columns named after the
environment class, added (weight 1) to the reward service's total before the
group's advantages; every row (fork) of a conversation shares its advantage.
A sample's policy_version is the oldest version of a trained token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time

from agrpo.v1 import common_pb2
from services.common.identity import now_timestamp
from services.common.logging import get_logger

from .conversation import ConversationResult, TurnLimits, run_conversation
from .environments import Environments, append_to_last_user, env_reward, public_methods, reset
from .reconcile import common_prefix
from .tools import load_tools, tool_schema

log = get_logger("rollout.multiturn")


def enabled(cfg) -> bool:
    return bool(cfg.tools or cfg.environment_factory)


def prompt_tools(cfg):
    """`row -> tool schemas` its first turn shows (configured tools + its environment's)."""
    schemas = [tool_schema(f) for f in load_tools(cfg.tools).values()]
    envs = Environments.from_config(cfg.environment_factory) if cfg.environment_factory else None

    def for_row(row: dict) -> list[dict]:
        return schemas + (envs.spec_for(row).schemas if envs else [])
    return for_row


def environment_rows(cfg) -> list[dict]:
    """Without a dataset the environment writes each prompt at reset(): one step's worth
    of empty prompts per epoch; max_steps bounds the run (checked by the config)."""
    per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps
    return [{cfg.dataset.prompt_column: []} for _ in range(max(1, per_step // cfg.num_generations))]


def merge_env_rewards(totals: list[float], components: dict[str, list[float]],
                      results: list[ConversationResult]) -> tuple[list[float], dict[str, list[float]]]:
    """Add each conversation's environment rewards (weight 1) to its total (NaN + x = x)."""
    totals, components = list(totals), {k: list(v) for k, v in components.items()}
    for i, res in enumerate(results):
        for name, value in res.env_rewards.items():
            components.setdefault(name, [math.nan] * len(results))[i] = value
            if not math.isnan(value):
                totals[i] = value if math.isnan(totals[i]) else totals[i] + value
    return totals, components


def tool_metrics(res: ConversationResult) -> dict[str, float]:
    """Per-sample metrics as TRL names them, plus latency and reconciliation counts."""
    lat = res.tool_latencies
    return {"tools/call_frequency": float(res.tool_calls),
            "tools/failure_frequency": res.tool_failures / res.tool_calls if res.tool_calls else 0.0,
            "tools/latency_ms": 1000 * sum(lat) / len(lat) if lat else 0.0,
            "tools/loop_exhausted": float(res.loop_exhausted),
            "rollout/turns": float(res.turns), "rollout/forks": float(res.tally.fork),
            "rollout/realigns": float(res.tally.realign)}


class MultiTurn:
    """Tools, environments and limits for the engine's multi-turn groups."""

    def __init__(self, cfg, tokenizer, engine) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.engine = engine
        self.tools = load_tools(cfg.tools)
        self.schemas = [tool_schema(f) for f in self.tools.values()]
        self.envs = Environments.from_config(cfg.environment_factory) if cfg.environment_factory else None
        self.stats = {"conversations": 0, "tool_calls": 0, "tool_failures": 0, "forks": 0}

    def limits(self) -> TurnLimits:
        lens = [s.client.info.max_model_len for s in self.engine.balancer.servers
                if getattr(s.client, "info", None) is not None]
        max_len = min(lens) if lens else int(getattr(self.tokenizer, "model_max_length", 1 << 30))
        return TurnLimits(self.cfg.max_completion_length, max_len, self.cfg.max_tool_calling_iterations,
                          self.cfg.rollout.tool_timeout_s, self.cfg.fork_threshold_tokens)

    # Generation
    async def gather(self, prompt, group) -> list[ConversationResult]:
        """All G conversations, or the first failure with the others cancelled."""
        from ..engine import gather_or_cancel

        return await gather_or_cancel([self._one(prompt, group, i) for i in range(self.engine.G)])

    async def _one(self, prompt, group, i: int) -> ConversationResult:
        from ..engine import label_version

        eng = self.engine

        async def generate(ids, max_tokens, turn):
            sampling = dataclasses.replace(eng.sampling, max_tokens=max_tokens)
            out = await eng.balancer.generate(ids, sampling, f"{group.group_id}-{i}-t{turn}")
            eng._count_tokens(len(out.token_ids))
            return out

        def version_of(label):
            return group.dispatch_version if label is None else label_version(label, group.dispatch_version)

        try:
            return await self.run(prompt, generate, version_of)
        finally:
            eng._release(group, 1)

    async def run(self, prompt, generate, version_of) -> ConversationResult:
        """One conversation: borrow an environment (if any), talk, score it with get_reward."""
        messages = ([{"role": "user", "content": prompt.prompt}] if isinstance(prompt.prompt, str)
                    else [dict(m) for m in prompt.prompt])
        tools, schemas = dict(self.tools), list(self.schemas)
        spec = inst = None
        if self.envs is not None:
            row = {self.cfg.dataset.prompt_column: prompt.prompt, **prompt.columns}
            spec = self.envs.spec_for(row)
            inst = self.envs.acquire(spec)
        try:
            if inst is not None:
                messages = append_to_last_user(messages, await reset(inst, row))
                env_tools = public_methods(inst)
                tools.update({n: env_tools[n] for n in spec.tool_names})
                schemas += spec.schemas
            res = await run_conversation(generate, self.tokenizer, messages, tools=tools, schemas=schemas,
                                         limits=self.limits(), version_of=version_of,
                                         chat_template_kwargs=self.cfg.chat_template_kwargs)
            if inst is not None and spec.has_reward:
                try:
                    res.env_rewards[spec.class_name] = await env_reward(inst)
                except Exception as exc:  # noqa: BLE001 - an env bug is a NaN reward, not a crash
                    log.warning("%s.get_reward failed: %s", spec.class_name, exc)
                    res.env_rewards[spec.class_name] = math.nan
        finally:
            if inst is not None:
                self.envs.release(spec, inst)
        if res.turns == 0:
            log.warning("prompt %d does not fit max_model_len with its tool schemas: no turn generated",
                        prompt.index)
        self._count(res)
        return res

    def _count(self, res: ConversationResult) -> None:
        s = self.stats
        s["conversations"] += 1
        s["tool_calls"] += res.tool_calls
        s["tool_failures"] += res.tool_failures
        s["forks"] += res.tally.fork

    # Tagging, scoring, samples
    @staticmethod
    def tag(results: list[ConversationResult], fallback: int) -> int:
        vs = [v for r in results for row in r.rows if (v := row.oldest_version()) is not None]
        return min(vs) if vs else fallback

    def score_inputs(self, group, prompt):
        """(texts, completions as messages or text, completion token ids) for the reward service."""
        results = group.completions
        texts = [r.text for r in results]
        completions = [r.messages for r in results] if prompt.conversational else texts
        ids = [[t for row in r.rows for t, m in zip(row.ids, row.mask) if m] for r in results]
        return texts, completions, ids

    def samples(self, group, prompt, texts, totals, components, scoring_ms, wait_ms) -> list:
        from ..advantage import group_advantages, group_stats

        eng, results = self.engine, group.completions
        adv = group_advantages(totals)
        _, std = group_stats(totals)
        firsts = [r.rows[0].ids for r in results if r.rows]
        out = []
        for i, res in enumerate(results):
            for k, row in enumerate(res.rows):
                P = min(common_prefix(row.ids, f) for f in firsts)
                P = min(P, row.mask.index(1))
                spans = [common_pb2.VersionSpan(policy_version=v, start=s, end=e) for v, s, e in row.spans()]
                metrics = {"reward": totals[i], "reward_std": std, "scoring_time_ms": scoring_ms,
                           "wait_scoring_ms": wait_ms, "buffer_qsize": float(eng.sender.held),
                           "generation_tok_per_s": res.generated / max(res.latency_s, 1e-9),
                           **tool_metrics(res), **{f"rewards/{n}": v[i] for n, v in components.items()}}
                send = eng.cfg.rollout.send_text
                out.append(common_pb2.RolloutSample(
                    sample_id=f"{group.group_id}-{i}" + (f"-f{k}" if k else ""), group_id=group.group_id,
                    prompt_key=common_pb2.PromptKey(dataset_index=group.key[0], epoch=group.key[1]),
                    policy_version=row.oldest_version() if row.oldest_version() is not None else group.version,
                    version_spans=spans, input_ids=row.ids, completion_mask=row.mask,
                    behavior_logprobs=row.logprobs, prompt_length=P, advantage=adv[i], reward=totals[i],
                    reward_components={n: v[i] for n, v in components.items()}, metrics=metrics,
                    generation_index=i, prompt_text=prompt.prompt_text if send else "",
                    completion_text=texts[i] if send else "", created_at=now_timestamp(),
                    producer_id=eng.producer_id))
        return out
