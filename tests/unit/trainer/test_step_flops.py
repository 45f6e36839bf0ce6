"""benchmarks/gpu_train_throughput.step_flops: the FLOP bound that tree vs plain packing is judged by."""

from types import SimpleNamespace

import gpu_train_throughput as bench  # benchmarks/ is on pytest's pythonpath

CFG = SimpleNamespace(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100)


def _samples(groups: int, completion: int):
    return bench.make_samples(groups, 4, prompt=16, completion=completion, vocab=CFG.vocab_size)


def test_one_sample_costs_the_same_as_tree_or_plain_chain():
    one = _samples(1, 8)[:1]
    tree, plain = bench.tree_rows(one, 1), bench.plain_rows(one, 1)
    assert bench.step_flops(CFG, tree, True) == bench.step_flops(CFG, plain, True)


def test_a_shared_prompt_is_counted_once_in_the_tree():
    samples = _samples(2, 8)
    tree = bench.step_flops(CFG, bench.tree_rows(samples, 4), True)
    plain = bench.step_flops(CFG, bench.plain_rows(samples, 4), True)
    assert 1.0 < plain / tree < (8 * 24) / (2 * 16 + 8 * 8)  # below the unique-token ratio: the head is shared by both


def test_checkpointing_adds_one_forward_of_the_decoder():
    rows = bench.tree_rows(_samples(1, 8), 4)
    with_gc, without = bench.step_flops(CFG, rows, True, gc=True), bench.step_flops(CFG, rows, True, gc=False)
    head = 2 * CFG.hidden_size * CFG.vocab_size * sum(r.num_terms for r in rows) * 5
    assert (with_gc - head) / (without - head) > 1.25  # 4/3 for the matmuls, 4.5/3.5 for attention
