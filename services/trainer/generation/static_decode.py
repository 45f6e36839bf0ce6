"""Decode steps of fixed shape, replayed as one CUDA graph on a GPU.

Why: an eager decode step of a transformers model is hundreds of small kernels launched from
Python, one token at a time; on a GPU that launch time, not the arithmetic, is the step (a
0.5B model: tens of ms a token). With every shape fixed the step can be captured once and
replayed with one launch. Shapes are fixed by:

- a KV cache of one length for the whole batch (`StaticKV`), written at one position per step:
  prompts are left-padded, so every row's next token lands at the same index;
- a 4D additive attention mask over that whole length (transformers uses a 4D mask as given),
  opened one position per step;
- the rows staying in the batch until the batch is done (a finished row's tokens are ignored);
- batch sizes and cache lengths rounded up (`bucket`, `row_bucket`: spare rows decode nothing
  anyone reads), so the batches a run sees share a few captured graphs; a batch also runs on a
  kept decoder up to twice its shape (`reusable`), so prompts of many lengths do not cycle
  through captures.

`Decoder.step` runs the captured graph when there is one, else the same step eagerly (CPU,
or a GPU where capture failed or disagreed with the eager step: one warning, then eager).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import torch

from agrpo.services.common.logging import get_logger

log = get_logger("trainer.generation.static")
T = TypeVar("T")

LENGTH_BUCKET = 32
"""Cache lengths are rounded up to a multiple of this, so batches of similar lengths share a
captured graph."""
REUSE_SLACK = 2
"""A kept decoder serves a batch whose own shape is at most this many times smaller in rows and
in length: spare rows and masked positions cost little beside a new capture."""
GRAPH_TOLERANCE = 2e-2
"""Largest |logit| difference between a replayed graph and the eager step it was captured from,
relative to the largest |logit| (bf16 kernels may differ in the last bits; a wrong capture is
off by the logits' own size)."""


class StaticKV:
    """transformers' cache interface over fixed [rows, heads, length, head_dim] tensors per layer."""

    def __init__(self, layers: int, shape: tuple[int, int, int, int], dtype: torch.dtype, device) -> None:
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        """Where this step's keys and values go (a tensor, so a replayed graph reads it)."""

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, cache_kwargs=None):
        self.keys[layer_idx].index_copy_(2, self.pos, key)
        self.values[layer_idx].index_copy_(2, self.pos, value)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.keys[0].shape[2]

    def fill(self, prefill, width: int) -> None:
        """The prefill's keys and values (a DynamicCache of `width` positions, one row per
        sequence) in the first rows, at the start; the rest is masked until written."""
        for i, layer in enumerate(prefill.layers):
            rows = layer.keys.shape[0]
            self.keys[i][:rows, :, :width].copy_(layer.keys)
            self.values[i][:rows, :, :width].copy_(layer.values)
        self.pos.fill_(width)


class Decoder:
    """One batch shape's decode step: static inputs, cache, mask and output, maybe a graph."""

    def __init__(self, model: torch.nn.Module, rows: int, length: int, kv_shape: tuple[int, int],
                 dtype: torch.dtype, device) -> None:
        heads, head_dim = kv_shape
        layers = model.config.num_hidden_layers
        self.model = model
        self.cache = StaticKV(layers, (rows, heads, length, head_dim), dtype, device)
        self.mask = torch.zeros(rows, 1, 1, length, dtype=dtype, device=device)
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.logits: torch.Tensor | None = None
        self.graph = None
        self.used = rows  # rows of the current batch (start())

    def start(self, prefill, mask2d: torch.Tensor, last_position: torch.Tensor) -> None:
        """A new batch (as many rows as `mask2d`, at most the decoder's): its prefilled cache, its
        padding, each row's last prompt position. Spare rows see only their own new tokens."""
        self.used, width = mask2d.shape
        self.cache.fill(prefill, width)
        self.mask.fill_(torch.finfo(self.mask.dtype).min)
        self.mask[:self.used, 0, 0, :width].masked_fill_(mask2d.bool(), 0.0)
        self.positions.zero_()
        self.positions[:self.used].copy_(last_position.view(-1, 1))
        self.tokens.zero_()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed each used row's newest token; their next logits [used rows, vocab]."""
        self.tokens[:self.used].copy_(tokens.view(-1, 1))
        if self.graph is not None:
            self.graph.replay()
        else:
            self._body()
        assert self.logits is not None
        return self.logits[:self.used]

    def _body(self) -> None:
        self.positions += 1
        self.mask.index_fill_(3, self.cache.pos, 0.0)
        out = self.model(input_ids=self.tokens, attention_mask=self.mask, position_ids=self.positions,
                         past_key_values=self.cache, use_cache=True)
        logits = out.logits[:, -1, :]
        if self.logits is None:
            self.logits = torch.empty_like(logits)
        self.logits.copy_(logits)
        self.cache.pos += 1

    def warm_up(self) -> None:
        """One eager step on whatever the buffers hold (start() sets them afterwards)."""
        self._body()

    def capture(self) -> bool:
        """Capture the step as a CUDA graph (warm-up on a side stream first, as CUDA requires)
        and check one replay against the eager step; False (eager steps from then on) if the
        capture or the check fails. A failing eager step raises. Leaves the batch state to be set
        by start()."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.warm_up()
        torch.cuda.current_stream().wait_stream(side)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # the trainer may run meanwhile
                self._body()
            assert self.logits is not None
            self.cache.pos.fill_(1)
            self.positions.fill_(0)
            self._body()  # eager, at position 1
            eager = self.logits.clone()
            self.cache.pos.fill_(1)
            self.positions.fill_(0)
            graph.replay()  # the same inputs, through the graph
            gap = float((self.logits.float() - eager.float()).abs().max())
            if not gap <= GRAPH_TOLERANCE * (1.0 + float(eager.float().abs().max())):
                raise RuntimeError(f"a replay differs from the eager step by {gap:.3g}")
        except Exception as exc:  # noqa: BLE001 - any failure means eager decoding, never a failed run
            log.warning("decoding without CUDA graphs (%s: %s)", type(exc).__name__, str(exc).splitlines()[0][:200])
            return False
        self.graph = graph
        return True


def bucket(length: int) -> int:
    """A cache length of at least `length`, rounded up to LENGTH_BUCKET."""
    return -(-length // LENGTH_BUCKET) * LENGTH_BUCKET


def row_bucket(rows: int) -> int:
    """A batch size of at least `rows`: the next power of two."""
    return 1 << max(0, rows - 1).bit_length()


def reusable(kept, rows: int, length: int, slack: float = REUSE_SLACK) -> tuple[int, int] | None:
    """The smallest kept (rows, length) shape that holds a batch of `rows` rows needing `length`
    positions, at most `slack` times the shape the batch would get (`row_bucket`, `bucket`);
    None: build that shape."""
    own_rows, own_length = row_bucket(rows), bucket(length)
    fits = [(r, n) for r, n in kept if rows <= r <= slack * own_rows and length <= n <= slack * own_length]
    return min(fits, key=lambda shape: shape[0] * shape[1], default=None)


class KeptShapes(Generic[T]):
    """What was built per decode shape (rows, cache length), the most recently used last: a batch
    takes a kept shape that holds it (`reusable`), else its own, built; beyond `size` shapes the
    least recently used is dropped."""

    def __init__(self, size: int, slack: float = REUSE_SLACK) -> None:
        self.size, self.slack = size, slack
        self._kept: dict[tuple[int, int], T] = {}

    def take(self, rows: int, length: int, build: Callable[[tuple[int, int]], T]) -> T:
        """What serves `rows` rows needing `length` positions; `build(shape)` makes a new one."""
        shape = reusable(self._kept, rows, length, self.slack) or (row_bucket(rows), bucket(length))
        item = self._kept.pop(shape) if shape in self._kept else build(shape)
        self._kept[shape] = item
        while len(self._kept) > self.size:
            self._kept.pop(next(iter(self._kept)))
        return item

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._kept)
