"""Engine on the tiny model: tree-packed == unpacked forwards, and a step lowers the loss."""

from __future__ import annotations

import sys

import pytest
import torch

from agrpo.services.common.config import AgrpoConfig
from agrpo.services.trainer.engine_factory import build_engine
from agrpo.services.trainer.packing import TokenBudgetBatcher, iter_batches


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    cfg = AgrpoConfig(model=str(tiny_model_dir), learning_rate=1e-2, gradient_checkpointing=True,
                      temperature=0.9)
    eng, _, _ = build_engine(cfg, str(tiny_model_dir))
    return eng


def test_tree_and_unpacked_forwards_agree(engine, make_groups):
    samples = make_groups(n_groups=2, size=3, prompt_len=10)
    mb = next(iter_batches(TokenBudgetBatcher(1, 512), samples))
    row = mb.rows[0]
    assert row.num_tokens < sum(len(s) for s in samples)  # the prompts really are shared
    with torch.no_grad():
        tree, ent_t = engine.row_logprobs(row, tree=True)
        flat, ent_f = engine.row_logprobs(row, tree=False)
    assert tree.shape == (row.num_terms,)
    assert torch.allclose(tree, flat, atol=1e-4)
    assert torch.allclose(ent_t, ent_f, atol=1e-4)
    original = engine.cfg.tree
    engine.cfg.tree = True
    loss_tree = engine.eval_loss([mb])
    engine.cfg.tree = False
    loss_flat = engine.eval_loss([mb])
    engine.cfg.tree = original
    assert loss_tree == pytest.approx(loss_flat, abs=1e-5)


def test_forward_auto_takes_the_tree_on_a_cpu_only_for_a_model_whose_matmuls_fill_the_step():
    from agrpo.services.trainer.engine_factory import CPU_TREE_MIN_PARAMS, tree_forward

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    small = torch.nn.Linear(10, 10, device="meta")
    big = torch.nn.Linear(CPU_TREE_MIN_PARAMS // 1000, 1000, device="meta")  # shapes only, no memory
    assert not tree_forward("auto", cpu, small) and tree_forward("auto", cpu, big)
    assert tree_forward("auto", cuda, small)
    assert tree_forward("tree", cpu, small) and not tree_forward("unpacked", cuda, big)


def test_a_tree_row_too_long_for_the_dense_mask_goes_unpacked_off_cuda(engine, make_groups, monkeypatch):
    from agrpo.services.trainer import engine as engine_module

    samples = make_groups(n_groups=1, size=3, prompt_len=10)
    row = next(iter_batches(TokenBudgetBatcher(1, 512), samples)).rows[0]
    with torch.no_grad():
        flat, _ = engine.row_logprobs(row, tree=False)
        monkeypatch.setattr(engine_module, "DENSE_ROW_MAX", row.num_tokens - 1)
        monkeypatch.setattr(engine_module.tree_attention, "dense_mask", lambda end: pytest.fail("the dense tree mask was built"))
        long, _ = engine.row_logprobs(row, tree=True)
    assert torch.equal(long, flat)


def test_step_lowers_loss_on_fixed_batch(engine, make_groups):
    samples = make_groups(n_groups=2, size=4, prompt_len=6, seed=3)
    batches = list(iter_batches(TokenBudgetBatcher(1, 512, max_samples=4), samples))
    assert len(batches) == 2
    before = engine.eval_loss(batches)
    stats = [engine.train_step(batches) for _ in range(3)]
    after = engine.eval_loss(batches)
    assert after < before
    assert stats[0]["loss"] == pytest.approx(before, rel=1e-4)
    for key in ("grad_norm", "learning_rate", "ratio", "kl", "entropy", "clip_ratio/region_mean"):
        assert key in stats[0]


def test_a_steps_loss_and_gradient_do_not_depend_on_how_its_micro_batches_cut_it(engine, make_groups):
    """The step's loss is normalised over all of its tokens (GRPOTrainer's dapo): one micro-batch
    or four of very different sizes give the same loss and the same gradient. A mean of
    per-micro-batch means (TRL's async trainer) would weigh the short micro-batch's tokens more."""
    samples = make_groups(n_groups=2, size=4, prompt_len=6, seed=5, max_completion=12)
    whole = list(iter_batches(TokenBudgetBatcher(1, 512), samples))
    cut = list(iter_batches(TokenBudgetBatcher(1, 512, max_samples=3), samples[:3])) + \
        list(iter_batches(TokenBudgetBatcher(1, 512), samples[3:4])) + \
        list(iter_batches(TokenBudgetBatcher(1, 512, max_samples=2), samples[4:]))
    assert len(whole) == 1 and len(cut) == 4
    assert len({mb.num_terms for mb in cut}) > 1  # uneven micro-batches: a mean of means would differ

    def loss_and_grads(batches):
        engine.model.zero_grad(set_to_none=True)
        terms = sum(mb.num_terms for mb in batches)
        total = 0.0
        for mb in batches:
            for row in mb.rows:
                loss, _ = engine.row_loss(row, terms, len(mb.rows), len(batches))
                loss.backward()
                total += loss.item()
        grads = [p.grad.clone() for p in engine.model.parameters() if p.grad is not None]
        engine.model.zero_grad(set_to_none=True)
        return total, grads

    loss_whole, grads_whole = loss_and_grads(whole)
    loss_cut, grads_cut = loss_and_grads(cut)
    assert loss_cut == pytest.approx(loss_whole, rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(grads_whole, grads_cut))
    assert engine.eval_loss(cut) == pytest.approx(engine.eval_loss(whole), rel=1e-5)


def test_moe_router_aux_loss_is_added(make_groups):
    from transformers import AutoModelForCausalLM, Qwen2MoeConfig

    from agrpo.services.trainer.engine import Engine, EngineConfig
    from agrpo.services.trainer.loss import LossConfig

    torch.manual_seed(0)
    cfg = Qwen2MoeConfig(vocab_size=1024, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, num_experts=4,
                         num_experts_per_tok=2, shared_expert_intermediate_size=16)
    model = AutoModelForCausalLM.from_config(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    samples = make_groups(n_groups=1, size=2)
    mb = next(iter_batches(TokenBudgetBatcher(1, 512), samples))
    losses = {}
    for coef in (0.0, 0.5):
        eng = Engine(model, opt, sched, EngineConfig(LossConfig(), tree=True, router_aux_loss_coef=coef))
        assert eng.moe is not None
        stats = eng.train_step([mb])
        losses[coef] = stats["loss"]
    assert stats["aux_loss"] > 0
    assert losses[0.5] == pytest.approx(losses[0.0] + 0.5 * stats["aux_loss"], rel=1e-4)


def test_a_step_times_its_forward_backward_and_optimizer_phases(engine, make_groups):
    from agrpo.services.trainer.engine import StepClock

    samples = make_groups(n_groups=2, size=4, prompt_len=6, seed=3)
    stats = engine.train_step(list(iter_batches(TokenBudgetBatcher(1, 512, max_samples=4), samples)))
    assert stats["perf/forward_backward_s"] > 0 and stats["perf/optimizer_s"] > 0
    assert isinstance(stats["loss"], float) and isinstance(stats["grad_norm"], float)
    clock = StepClock(torch.device("cpu"))
    clock.mark()
    clock.mark()
    spans = clock.spans()
    assert len(spans) == 2 and all(s >= 0 for s in spans)


def test_a_step_reads_the_device_once_after_the_optimizer_step(engine, make_groups, monkeypatch):
    """On a GPU every host read (item, tolist, bool, float, ...) waits for the queued kernels: the
    tree step (the GPU's path) reads its loss and diagnostics once, after the optimizer step is
    queued. Counted here on the CPU by wrapping those methods: a read from outside torch (agrpo's
    or transformers' code) counts; torch's own (the non-fused optimizer's step counters, CPU
    tensors on any device) not. The unpacked path adds transformers' padding-mask checks (two
    reads a forward), as any HF model given a 2-D mask does."""
    events: list[str] = []
    torch_dir = torch.__file__.rsplit("/", 1)[0]

    def counting(name, original):
        def read(self, *args, **kwargs):
            caller = sys._getframe(1)
            if not caller.f_code.co_filename.startswith(torch_dir):
                events.append(f"{name} from {caller.f_code.co_filename}:{caller.f_lineno}")
            return original(self, *args, **kwargs)
        return read

    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    step = engine.optimizer.step
    monkeypatch.setattr(engine.optimizer, "step", lambda *a, **k: (events.append("optimizer step"), step(*a, **k))[1])
    samples = make_groups(n_groups=2, size=4, prompt_len=6, seed=5)
    batches = list(iter_batches(TokenBudgetBatcher(1, 512, max_samples=4), samples))
    assert len(batches) == 2  # two micro-batches: a read between them would show too
    original, engine.cfg.tree = engine.cfg.tree, True
    try:
        stats = engine.train_step(batches)
    finally:
        engine.cfg.tree = original
    assert events[0] == "optimizer step" and len(events) == 2, events
    assert events[1].startswith("tolist from") and stats["entropy"] > 0  # the one read carried them


def test_a_rows_host_data_reaches_the_device_in_one_copy_before_its_forward(engine, make_groups, monkeypatch):
    """On a GPU a copy from pageable host memory waits for every queued kernel, so a tensor made
    from a row's lists after its forward stalls the step. Every host list of a tree step goes
    through row_inputs.to_device, once a row and before the row's forward: counted here by
    wrapping torch.tensor / torch.as_tensor (host data only) for calls from agrpo's services."""
    from pathlib import Path

    from agrpo.services.trainer import engine as engine_module

    events: list[str] = []
    services_dir = str(Path(engine_module.__file__).parents[1])

    def spy(name, make):
        def made(data, *args, **kwargs):
            caller = sys._getframe(1).f_code
            if (not isinstance(data, torch.Tensor) and caller.co_filename.startswith(services_dir)
                    and not caller.co_filename.endswith("row_inputs.py")):
                events.append(f"{name} from {caller.co_filename}:{caller.co_name}")
            return make(data, *args, **kwargs)
        return made

    monkeypatch.setattr(torch, "tensor", spy("tensor", torch.tensor))
    monkeypatch.setattr(torch, "as_tensor", spy("as_tensor", torch.as_tensor))
    upload, decode = engine_module.to_device, engine._decode
    monkeypatch.setattr(engine_module, "to_device", lambda *a, **k: (events.append("upload"), upload(*a, **k))[1])
    monkeypatch.setattr(engine, "_decode", lambda **k: (events.append("forward"), decode(**k))[1])
    samples = make_groups(n_groups=2, size=4, prompt_len=6, seed=7)
    batches = list(iter_batches(TokenBudgetBatcher(1, 512, max_samples=4), samples))
    original, engine.cfg.tree = engine.cfg.tree, True
    try:
        stats = engine.train_step(batches, staleness=lambda version: 0)
    finally:
        engine.cfg.tree = original
    assert events == ["upload", "forward"] * len(batches), events
    assert stats["mismatch/k3_kl_mean/staleness_0"] == pytest.approx(stats["kl"])  # every term at lag 0
