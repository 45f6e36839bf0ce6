"""Tree attention for the Engine's packed rows: a flex_attention BlockMask on GPU, a dense mask on CPU.

A packed row is a trie in pre-order (services/trainer/packing.py), so "kv is an
ancestor-or-self of q" is the interval test kv <= q <= subtree_end[kv]. As a
flex_attention `mask_mod` that test is O(1) per pair; flex evaluates it per 128-token
block, skips blocks with no allowed pair and runs full blocks unmasked, so the cost
follows the tree's attention load. The dense form of the same relation ([N, N] bool,
`dense_mask`) goes to SDPA: exact everywhere and the CPU path, but O(N^2) in memory and
compute (SDPA's masked kernels cannot skip blocks).

How the model reaches flex: `install` registers `make_attention(SDPA)` with transformers
under `IMPLEMENTATION` and points the model's config at it. That function sends a
BlockMask to flex and any other mask to transformers' SDPA, so one model serves the tree
path, the unpacked path, and gradient checkpointing's recomputes of either.

GQA: K/V are repeated up to the query heads before flex instead of passing
enable_gqa. flex's backward kernel parallelises over KV heads and loops over the query
heads of a group, so Qwen2's 2 KV heads underfill the GPU (docs/gpu.md, section 3, "Levers":
the K/V-repeat row); the repeat costs two small copies.

Compile (CUDA only; eager flex is an unfused reference that materialises the scores):
outside a compiled region flex_attention is compiled once per process with automatic
dynamic shapes: the first row length compiles a static kernel, the first different one
recompiles it with the length symbolic, and later lengths reuse that. Rows are padded to
a multiple of the 128-token block (`padded_length`): the pad tokens are lone roots that
attend only to themselves, so no real token sees them and their outputs are never read.
`compile_layers` compiles each decoder layer too (one graph shared by all layers of a
model, flex traced inside it), which fuses the norms, RoPE and SwiGLU around the matmuls.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

IMPLEMENTATION = "agrpo_tree"
BLOCK = 128  # flex_attention's default sparse block (torch.nn.attention.flex_attention)


def padded_length(n: int, block: int = BLOCK) -> int:
    """n rounded up to a whole number of flex blocks (at least one)."""
    return max(block, -(-n // block) * block)


def pad_tree(input_ids: list[int], position_ids: list[int], subtree_end: list[int],
             size: int) -> tuple[list[int], list[int], list[int]]:
    """A row's token lists padded to `size` with lone roots (token 0, depth 0, own subtree)."""
    n = len(input_ids)
    extra = size - n
    assert extra >= 0, (n, size)
    return input_ids + [0] * extra, position_ids + [0] * extra, subtree_end + list(range(n, size))


def dense_mask(subtree_end: torch.Tensor) -> torch.Tensor:
    """[N, N] bool for SDPA: allow[q, kv] iff kv <= q <= subtree_end[kv]."""
    idx = torch.arange(subtree_end.shape[0], device=subtree_end.device)
    return (idx[None, :] <= idx[:, None]) & (idx[:, None] <= subtree_end[None, :])


def block_mask(subtree_end: torch.Tensor) -> BlockMask:
    """flex_attention BlockMask of the ancestor-or-self relation over one padded row (B = H = 1).

    Built from the intervals at block granularity, without an [N, N] mask: kv reaches the
    queries [kv, end[kv]], so block pair (q block i, kv block j) holds an allowed pair iff
    some kv of j has kv <= last(i) and end[kv] >= first(i); it is full iff every kv of j
    precedes block i and every end in j reaches past it. Same blocks as create_block_mask
    (tests/unit/trainer/test_tree_attention.py) for a few small ops instead of a vmapped
    mask over N^2 pairs.
    """
    n = subtree_end.shape[0]
    assert n % BLOCK == 0, n
    nb, dev = n // BLOCK, subtree_end.device
    first = torch.arange(nb, device=dev) * BLOCK
    last = first + (BLOCK - 1)
    kv = torch.arange(n, device=dev)
    reach = (kv[None, :] <= last[:, None]) & (subtree_end[None, :] >= first[:, None])  # [q block, kv]
    some = reach.view(nb, nb, BLOCK).any(-1)
    full = (last[None, :] <= first[:, None]) & (subtree_end.view(nb, BLOCK).amin(-1)[None, :] >= last[:, None])

    def mask_mod(b, h, q, kv):
        return (kv <= q) & (q <= subtree_end[kv])

    return BlockMask.from_kv_blocks(*_sparse(some & ~full), *_sparse(full), BLOCK_SIZE=BLOCK,
                                    mask_mod=mask_mod, seq_lengths=(n, n))


def _sparse(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[nq, nkv] bool -> per q block the count [1, 1, nq] and the kv block indices, listed first."""
    counts = blocks.sum(-1, dtype=torch.int32)
    order = torch.sort(blocks.to(torch.int8), dim=-1, descending=True, stable=True).indices
    return counts[None, None], order.to(torch.int32)[None, None]


@functools.cache
def _compiled_flex():
    return torch.compile(flex_attention)


def _eager_flex(*args, **kwargs):
    with warnings.catch_warnings():  # eager flex warns that it is unfused: on CPU that is the point
        warnings.simplefilter("ignore", UserWarning)
        return flex_attention(*args, **kwargs)


def make_attention(fallback):
    """A transformers attention function: BlockMask -> flex_attention, any other mask -> `fallback`.

    query [B, Hq, S, D], key/value [B, Hkv, S, D]; returns ([B, S, Hq, D], None) as
    transformers' attention functions do. Inside a compiled region flex is traced as is;
    outside, CUDA calls the process's compiled flex and CPU the eager reference.
    """

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if not isinstance(attention_mask, BlockMask):
            return fallback(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        if dropout:
            raise ValueError("tree attention through flex_attention has no dropout")
        if torch.compiler.is_compiling():
            flex = flex_attention
        else:
            flex = _compiled_flex() if query.is_cuda else _eager_flex
        groups = query.shape[1] // key.shape[1]
        if groups > 1:  # see "GQA" in the module docstring
            key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        out = flex(query, key, value, block_mask=attention_mask, scale=scaling)
        return out.transpose(1, 2).contiguous(), None

    return attention


def install(model) -> None:
    """Route the model's attention through `make_attention(SDPA)` (idempotent; not saved with the config)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, make_attention(sdpa_attention_forward))
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)  # 2-D padding masks, as for SDPA
    model.config._attn_implementation = IMPLEMENTATION


def compile_layers(decoder) -> int:
    """torch.compile every decoder layer in place; returns how many were compiled.

    Layers of one class share one compiled graph (dynamo inlines the modules and guards
    on parameter shapes, not identity). HF gradient checkpointing still wraps each layer:
    its recompute reruns the compiled forward.
    """
    layers = getattr(decoder, "layers", None) or []
    for layer in layers:
        layer.compile()
    return len(layers)
