"""The single-turn strategy: G completions of one prompt, one training row each.

A strategy is what the engine calls for a group: `generate` (all G or nothing), `tag`
(the group's policy version), `score_inputs` (what the reward service sees), `rewards`
(reward-service totals, plus whatever the strategy adds) and `rows` (training rows).
The multi-turn strategy (multiturn/runner.py) has the same shape.
"""

from __future__ import annotations

from dataclasses import replace

from agrpo.services.common.versions import label_to_version, oldest_version

from .groups import GenerationContext, Group, gather_or_cancel
from .samples import Row
from .scoring import GroupScores
from .vllm_client import Completion


class SingleTurn:
    """One vLLM request per generation, or one per group (`rollout.one_request_per_group`)."""

    needs_reward_service = True

    def __init__(self, cfg, tokenizer, ctx: GenerationContext) -> None:
        self.tokenizer = tokenizer
        self.ctx = ctx
        self.one_request = cfg.rollout.one_request_per_group
        self.slots_to_start = ctx.num_generations if self.one_request else 1
        """Free request slots a group needs to start: its first request's, or all G at once."""

    async def generate(self, prompt, group: Group) -> list[Completion]:
        """All G completions, or the first failure with the other requests cancelled."""
        if self.one_request:
            return await self._all(prompt.prompt_ids, group)
        return await gather_or_cancel([self._one(prompt.prompt_ids, group, i)
                                       for i in range(self.ctx.num_generations)])

    async def _all(self, prompt_ids: list[int], group: Group) -> list[Completion]:
        """The G completions of one request (n = G), in the G slots the engine reserved at launch."""
        sampling = replace(self.ctx.sampling, n=self.ctx.num_generations)
        try:
            outs = await self.ctx.balancer.generate_all(prompt_ids, sampling, group.request_id(0), group.cache_salt,
                                                        self.ctx.adapter())
        finally:
            self.ctx.release(group, self.ctx.num_generations)
        self.ctx.count_tokens(sum(len(out.token_ids) for out in outs))
        return outs

    async def _one(self, prompt_ids: list[int], group: Group, i: int) -> Completion:
        try:
            async with self.ctx.request_slots:
                out = await self.ctx.balancer.generate(prompt_ids, self.ctx.sampling, group.request_id(i),
                                                        group.cache_salt, self.ctx.adapter())
        finally:
            self.ctx.release(group, 1)
        self.ctx.count_tokens(len(out.token_ids))
        return out

    @staticmethod
    def tag(group: Group) -> int:
        """The oldest version that produced a token (vLLM spans), else the dispatch version."""
        return oldest_version((label_to_version(label, group.dispatch_version)
                               for c in group.completions for label, s, e in c.spans if e > s),
                              group.dispatch_version)

    def score_inputs(self, group: Group, prompt):
        """(texts, completions as text or messages, completion token ids) for the reward service."""
        ids = [c.token_ids for c in group.completions]
        texts = [self.tokenizer.decode(t, skip_special_tokens=True) for t in ids]
        completions = ([[{"role": "assistant", "content": t}] for t in texts]
                       if prompt.conversational else texts)
        return texts, completions, ids

    @staticmethod
    def rewards(group: Group, scores: GroupScores) -> tuple[list[float], dict[str, list[float]]]:
        return scores.totals, scores.components

    @staticmethod
    def rows(group: Group, prompt) -> list[Row]:
        P = len(prompt.prompt_ids)
        out = []
        for i, c in enumerate(group.completions):
            spans = [(label_to_version(lb, group.dispatch_version), P + s, P + e) for lb, s, e in c.spans if e > s]
            # TRL's completions/clipped_ratio: the share cut at max_completion_length (no EOS).
            clipped = {"completions/clipped_ratio": float(c.finish_reason == "length")}
            out.append(Row(i, prompt.prompt_ids + c.token_ids, [0] * P + [1] * len(c.token_ids),
                           [0.0] * P + c.logprobs, P, spans, group.version,
                           len(c.token_ids) / max(c.latency_s, 1e-9), clipped))
        return out
