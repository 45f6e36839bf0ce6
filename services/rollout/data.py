"""The prompt dataset: load, render, tokenize, filter, and order per epoch.

Rows come from `datasets.load_dataset` (hub id, local folder, or json/jsonl/
parquet/csv files). The prompt column holds text (standard format) or a list of
messages (conversational format, rendered with the chat template and
`chat_template_kwargs`). Every other column travels with the prompt to the
reward functions. A prompt longer than max_model_len - max_completion_length is
skipped with a warning and counted. Epoch e visits the kept rows in a
permutation seeded by (seed, e), so a restart reproduces the same order.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agrpo.services.common.logging import get_logger

log = get_logger("rollout.data")


@dataclass
class Prompt:
    """One dataset row, ready to generate from."""

    index: int
    prompt: str | list[dict]
    """The raw prompt: text or messages."""
    prompt_ids: list[int]
    prompt_text: str
    columns: dict[str, Any] = field(default_factory=dict)

    @property
    def conversational(self) -> bool:
        return not isinstance(self.prompt, str)


def load_rows(dataset_cfg) -> list[dict]:
    """Rows of the configured split as plain dicts."""
    import datasets

    kwargs = dict(dataset_cfg.load_kwargs)
    if dataset_cfg.name:
        kwargs["name"] = dataset_cfg.name
    if dataset_cfg.data_files is not None:
        kwargs["data_files"] = dataset_cfg.data_files
    path = dataset_cfg.path
    if path in ("jsonl",):
        path = "json"
    if path is None:
        raise ValueError("dataset.path is not set: give a hub id, a folder, or json/csv/parquet with data_files")
    ds = datasets.load_dataset(path, split=dataset_cfg.split, **kwargs)
    return [dict(r) for r in ds]


def jsonable(value: Any) -> Any:
    """Make a dataset cell JSON-compatible (numpy scalars, dates, ...) for the reward call."""
    return json.loads(json.dumps(value, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v)))


def render(tokenizer, prompt: str | list[dict], chat_template_kwargs: dict | None,
           tools: list[dict] | None = None) -> tuple[list[int], str]:
    """Token ids and text of a prompt: chat template for messages, plain encoding for text.

    With `tools` (multi-turn), the prompt is rendered as the conversation's first turn
    will be, tool schemas included, so the length check counts them."""
    if tools is not None and isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"]), prompt
    if not prompt:  # an environment provides the whole prompt at reset()
        return [], ""
    extra = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False,
                                         **extra, **(chat_template_kwargs or {}))
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]), text


class PromptSet:
    """The trainable prompts of the dataset and their per-epoch order."""

    def __init__(self, prompts: list[Prompt], seed: int, num_rows: int, skipped: int) -> None:
        self.prompts = {p.index: p for p in prompts}
        self.seed = seed
        self.num_rows = num_rows
        self.skipped = skipped
        self._order_cache: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> Prompt:
        return self.prompts[index]

    def order(self, epoch: int) -> list[int]:
        """Dataset indices of the kept prompts, shuffled for this epoch."""
        if epoch not in self._order_cache:
            idx = sorted(self.prompts)
            random.Random(f"{self.seed}:{epoch}").shuffle(idx)
            self._order_cache = {epoch: idx}
        return self._order_cache[epoch]


def build_prompt_set(rows: list[dict], tokenizer, *, prompt_column: str, max_prompt_len: int,
                     chat_template_kwargs: dict | None, seed: int,
                     tools_for_row: Callable[[dict], list[dict]] | None = None) -> PromptSet:
    """Render every row (with its tool schemas, for multi-turn); skip (and count) rows
    whose prompt does not fit."""
    prompts, skipped = [], 0
    for i, row in enumerate(rows):
        if prompt_column not in row:
            raise ValueError(f"dataset.prompt_column={prompt_column!r}: the dataset has no such column "
                             f"(columns: {', '.join(sorted(row))})")
        raw = row[prompt_column]
        tools = tools_for_row(row) if tools_for_row else None
        ids, text = render(tokenizer, raw, chat_template_kwargs, tools)
        if len(ids) > max_prompt_len:
            skipped += 1
            log.warning("prompt %d has %d tokens > %d (max_model_len - max_completion_length): skipped",
                        i, len(ids), max_prompt_len)
            continue
        columns = {k: jsonable(v) for k, v in row.items() if k != prompt_column}
        prompts.append(Prompt(i, raw, ids, text, columns))
    if not prompts:
        raise ValueError(f"no prompt of {len(rows)} fits in {max_prompt_len} tokens "
                         "(max_model_len - max_completion_length)")
    if skipped:
        log.warning("skipped %d of %d prompts as too long", skipped, len(rows))
    return PromptSet(prompts, seed, len(rows), skipped)


def load_tokenizer(name: str, trust_remote_code: bool = False):
    """The tokenizer of the policy (lazy transformers import)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
