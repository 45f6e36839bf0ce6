"""The multi-turn strategy: G conversations per group, rewards, rows -> samples.

Used only when the config sets `tools` or `environment_factory`. A group's G
conversations run concurrently; each holds one in-flight slot until it ends.
Environment rewards (`get_reward`) become reward columns named after the
environment class, added (weight 1) to the reward service's total before the
group's advantages; every row (fork) of a conversation shares its advantage.
A sample's policy_version is the oldest version of a trained token. Same shape as
the single-turn strategy (services/rollout/single_turn.py).
"""

from __future__ import annotations

import dataclasses
import math

from agrpo.services.common.logging import get_logger
from agrpo.services.common.versions import label_to_version, oldest_version

from ..groups import GenerationContext, Group, gather_or_cancel
from ..samples import Row
from ..scoring import GroupScores
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
    return [{cfg.dataset.prompt_column: []} for _ in range(cfg.samples_per_step() // cfg.num_generations)]


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


def tool_metrics(res: ConversationResult, group_called: bool) -> dict[str, float]:
    """Per-sample metrics as TRL names them, plus latency and reconciliation counts. As in
    TRL, tools/call_frequency and failure_frequency exist only for groups that called a tool."""
    lat = res.tool_latencies
    out = {"tools/latency_ms": 1000 * sum(lat) / len(lat) if lat else 0.0,
           "tools/loop_exhausted": float(res.loop_exhausted),
           "rollout/turns": float(res.turns), "rollout/forks": float(res.tally.fork),
           "rollout/realigns": float(res.tally.realign)}
    if group_called:
        out["tools/call_frequency"] = float(res.tool_calls)
        out["tools/failure_frequency"] = res.tool_failures / res.tool_calls if res.tool_calls else 0.0
    return out


class MultiTurn:
    """Tools, environments and limits for multi-turn groups."""

    slots_to_start = 1
    """A group starts with one free slot: each of its conversations takes one as it begins."""

    def __init__(self, cfg, tokenizer, ctx: GenerationContext) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.ctx = ctx
        self.tools = load_tools(cfg.tools)
        self.schemas = [tool_schema(f) for f in self.tools.values()]
        self.envs = Environments.from_config(cfg.environment_factory) if cfg.environment_factory else None
        self.stats = {"conversations": 0, "tool_calls": 0, "tool_failures": 0, "forks": 0}

    @property
    def needs_reward_service(self) -> bool:
        """An environment with get_reward may own the reward: then reward_funcs are optional."""
        return bool(self.cfg.reward_funcs)

    def limits(self) -> TurnLimits:
        lens = [s.client.info.max_model_len for s in self.ctx.balancer.servers
                if getattr(s.client, "info", None) is not None]
        max_len = min(lens) if lens else int(getattr(self.tokenizer, "model_max_length", 1 << 30))
        return TurnLimits(self.cfg.max_completion_length, max_len, self.cfg.max_tool_calling_iterations,
                          self.cfg.rollout.tool_timeout_s, self.cfg.fork_threshold_tokens)

    # Generation
    async def generate(self, prompt, group: Group) -> list[ConversationResult]:
        """All G conversations, or the first failure with the others cancelled."""
        return await gather_or_cancel([self._one(prompt, group, i) for i in range(self.ctx.num_generations)])

    async def _one(self, prompt, group: Group, i: int) -> ConversationResult:
        ctx = self.ctx

        async def generate(ids, max_tokens, turn):
            sampling = dataclasses.replace(ctx.sampling, max_tokens=max_tokens)
            out = await ctx.balancer.generate(ids, sampling, f"{group.request_id(i)}-t{turn}",
                                              group.cache_salt, ctx.adapter())
            ctx.count_tokens(len(out.token_ids))
            return out

        def version_of(label):
            return label_to_version(label, group.dispatch_version)

        try:
            async with ctx.request_slots:
                return await self.run(prompt, generate, version_of)
        finally:
            ctx.release(group, 1)

    async def run(self, prompt, generate, version_of) -> ConversationResult:
        """One conversation: borrow an environment (if any), talk, score it with get_reward."""
        messages = ([{"role": "user", "content": prompt.prompt}] if isinstance(prompt.prompt, str)
                    else [dict(m) for m in prompt.prompt])
        tools, schemas = dict(self.tools), list(self.schemas)
        envs, spec, inst = self.envs, None, None  # spec and inst are set together, with envs
        if envs is not None:
            row = {self.cfg.dataset.prompt_column: prompt.prompt, **prompt.columns}
            spec = envs.spec_for(row)
            inst = envs.acquire(spec)
        try:
            if spec is not None and inst is not None:
                messages = append_to_last_user(messages, await reset(inst, row))
                env_tools = public_methods(inst)
                tools.update({n: env_tools[n] for n in spec.tool_names})
                schemas += spec.schemas
            res = await run_conversation(generate, self.tokenizer, messages, tools=tools, schemas=schemas,
                                         limits=self.limits(), version_of=version_of,
                                         chat_template_kwargs=self.cfg.chat_template_kwargs)
            if spec is not None and inst is not None and spec.has_reward:
                try:
                    res.env_rewards[spec.class_name] = await env_reward(inst)
                except Exception as exc:  # noqa: BLE001 - an env bug is a NaN reward, not a crash
                    log.warning("%s.get_reward failed: %s", spec.class_name, exc)
                    res.env_rewards[spec.class_name] = math.nan
        finally:
            if envs is not None and spec is not None and inst is not None:
                envs.release(spec, inst)
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

    # Tagging, scoring, rows
    @staticmethod
    def tag(group: Group) -> int:
        """The oldest version of a trained token over all rows, else the dispatch version."""
        return oldest_version((row.oldest_version() for r in group.completions for row in r.rows),
                              group.dispatch_version)

    def score_inputs(self, group: Group, prompt):
        """(texts, completions as messages or text, completion token ids) for the reward service."""
        results = group.completions
        texts = [r.text for r in results]
        completions = [r.messages for r in results] if prompt.conversational else texts
        ids = [[t for row in r.rows for t, m in zip(row.ids, row.mask) if m] for r in results]
        return texts, completions, ids

    @staticmethod
    def rewards(group: Group, scores: GroupScores) -> tuple[list[float], dict[str, list[float]]]:
        """The reward service's totals plus each conversation's environment rewards."""
        return merge_env_rewards(scores.totals, scores.components, group.completions)

    @staticmethod
    def rows(group: Group, prompt) -> list[Row]:
        """Every row of every conversation; a row's prompt is what all first rows share."""
        results = group.completions
        firsts = [r.rows[0].ids for r in results if r.rows]
        called = any(r.tool_calls for r in results)
        out = []
        for i, res in enumerate(results):
            tok_per_s = res.generated / max(res.latency_s, 1e-9)
            for k, row in enumerate(res.rows):
                shared = min(common_prefix(row.ids, f) for f in firsts)
                P = min(shared, row.mask.index(1))
                out.append(Row(i, row.ids, row.mask, row.logprobs, P, row.spans(),
                               oldest_version([row.oldest_version()], group.version), tok_per_s,
                               tool_metrics(res, called), fork=k))
        return out
