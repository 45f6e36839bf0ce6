"""benchmarks/vs_trl.py's long GPU races, checked on the CPU: what each side is given (agrpo: the
shape alone, through `agrpo demo`'s own parser and config; TRL: its micro-batches), and what a run
reports (tokens/s, stale share, MFU, peak memory, a run cut short)."""

import argparse
import json
from pathlib import Path

import pytest
import yaml

import gpu_memory
import trl_runner  # benchmarks/ is on pytest's pythonpath
import vs_trl
from agrpo.demo import runner
from agrpo.demo.cli import parse
from agrpo.services.common.config import load_config


def _args(tmp_path, **kw):
    base = dict(steps=None, trl_threads=2, set=[], trl_python=Path("/x/python"), trl_grad_accum=None,
                trl_grad_ckpt=None, out=tmp_path, cache=tmp_path / "cache", timeout=3600, budget_s=None)
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize("name", ["tiny", "smollm2", "gpu-0.5b", "gpu-1.5b", "gpu-smollm2"])
def test_the_toy_races_run_as_before(tmp_path, name):
    task, a = vs_trl.TASKS[name], _args(tmp_path)
    trl = vs_trl.trl_argv(task, 0, Path("m"), Path("p"), a)
    assert not {"--prompts-per-step", "--grad-accum", "--grad-ckpt"} & set(trl)
    # the shaped models' vLLM context stays what TRL read from their config before it was raised
    assert trl_runner.parse_args(trl[2:]).vllm_max_model_length == (1024 if name in ("gpu-0.5b", "gpu-1.5b") else None)
    agrpo = vs_trl.agrpo_argv(task, "agrpo", 0, a)
    assert task.shape_args() == [] and "--task" not in agrpo and "--num-prompts" not in agrpo
    assert agrpo[agrpo.index("--set") + 1] == "seed=0" and agrpo.count("--set") == 1


def _demo_config(tmp_path, argv):
    opts = parse(argv[argv.index("demo") + 1:])
    runner.check_config(opts)  # what `agrpo demo` itself checks first
    opts.out.mkdir(parents=True)
    path = runner.write_config(opts, tmp_path / "model", tmp_path / "p.jsonl", "http://127.0.0.1:1")
    return opts, load_config(["--config", str(path)]), yaml.safe_load(path.read_text())


def test_the_long_races_give_agrpo_the_shape_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setattr("agrpo.launcher.gpus.gpu_count", lambda: 1)
    a = _args(tmp_path)
    argv = vs_trl.agrpo_argv(vs_trl.TASKS["gpu-1.5b-long"], "agrpo", 3, a)
    opts, cfg, raw = _demo_config(tmp_path, argv)
    assert opts.model == "1.5b" and opts.steps == 60 and opts.gpu is not None
    assert cfg.per_device_train_batch_size == 64 and cfg.max_completion_length == 1024 and cfg.num_generations == 8
    assert cfg.learning_rate == runner.SHAPED_LR and cfg.seed == 3 and cfg.gradient_accumulation_steps == 1
    assert opts.overrides == {"seed": 3, "per_device_train_batch_size": 64, "max_completion_length": 1024}
    assert "schedule" not in raw["trainer"] and "generation" not in raw.get("launcher", {})

    argv = vs_trl.agrpo_argv(vs_trl.TASKS["gpu-smollm2-long"], "agrpo", 0, _args(tmp_path, steps=20))
    opts, cfg, _ = _demo_config(tmp_path, argv)
    assert (opts.model, opts.task, opts.num_prompts, opts.steps) == ("smollm2", "word-problems", 512, 20)
    assert cfg.per_device_train_batch_size == 64 and cfg.max_completion_length == 512
    assert cfg.reward_funcs[0].name == "agrpo.demo.task:final_answer" and cfg.dtype == "float32"


def test_the_long_races_give_trl_its_micro_batches(tmp_path):
    a = _args(tmp_path)
    long15 = vs_trl.TASKS["gpu-1.5b-long"]
    argv = vs_trl.trl_argv(long15, 0, Path("m"), Path("p"), a)
    args = trl_runner.parse_args(argv[2:])
    assert (args.prompts_per_step, args.num_generations, args.grad_accum, args.grad_ckpt) == (8, 8, 8, False)
    assert args.max_completion_length == 1024 and args.vllm_max_model_length == 2048 and args.lr == runner.SHAPED_LR
    assert args.use_vllm and args.vllm_mode == "colocate" and not args.vllm_enable_sleep_mode
    assert vs_trl.task_record(long15, a)["trl_per_device_train_batch_size"] == 8
    smol = vs_trl.TASKS["gpu-smollm2-long"]
    args = trl_runner.parse_args(vs_trl.trl_argv(smol, 0, Path("m"), Path("p"), a)[2:])
    assert (args.prompts_per_step, args.grad_accum, args.max_completion_length) == (8, 2, 512)
    assert args.dtype == "float32" and args.bf16 and args.reward_func == "final_answer"
    # the command line overrides the task's choice
    over = trl_runner.parse_args(vs_trl.trl_argv(long15, 0, Path("m"), Path("p"),
                                                 _args(tmp_path, trl_grad_accum=16, trl_grad_ckpt=True))[2:])
    assert (over.grad_accum, over.grad_ckpt) == (16, True)
    with pytest.raises(SystemExit):  # 64 completions do not split into 3 micro-batches
        vs_trl.trl_argv(long15, 0, Path("m"), Path("p"), _args(tmp_path, trl_grad_accum=3))
    with pytest.raises(SystemExit):
        trl_runner.parse_args(["--model", "m", "--prompts", "p", "--reward-file", "f", "--reward-func", "r",
                               "--out", "o", "--grad-accum", "3"])


def test_a_run_reports_tokens_stale_share_mfu_and_memory(tmp_path):
    task = vs_trl.TASKS["gpu-1.5b-long"]
    run = vs_trl.Run("agrpo", 0, steps=[(20.0, 5.0, 0.1), (30.0, 15.0, 0.2), (42.0, 27.0, 0.3)],
                     tokens=[64 * 500.0, 64 * 600.0, 64 * 700.0],
                     extra={"stale_share": 0.02, "generated_per_trained": 1.25, "mfu": 0.3, "gpu_peak_gib": 60.0})
    out = vs_trl.numbers(run, task)
    assert out["trained_tok_per_s"] == pytest.approx(64 * 1300 / 22)  # steps 2..3 over step 1's end to 3's
    assert out["generated_tok_per_s"] == pytest.approx(1.25 * 64 * 1300 / 22)
    assert out["completion_len"] == pytest.approx(600) and out["s_per_step"] == pytest.approx(11)
    assert out["stale_share"] == 0.02 and out["mfu"] == 0.3 and out["gpu_peak_gib"] == 60.0
    assert "generated_per_trained" not in out and "cut_short" not in out
    lines = vs_trl.table({"trl": [{**out, "stale_share": 0.0}], "agrpo": [{**out, "cut_short": True}]}, task)
    header = [c.strip() for c in lines[0].split("|")]
    for key in ("trained_tok_per_s", "generated_tok_per_s", "stale_share", "mfu", "gpu_peak_gib", "torch_peak_gib"):
        assert key in header
    assert "1/1 (1 cut short)" in lines[3]
    assert "trained_tok_per_s" in vs_trl.table({"trl": [out]}, vs_trl.TASKS["tiny"])[0]
    assert "gpu_peak_gib" not in vs_trl.table({"trl": [out]}, vs_trl.TASKS["tiny"])[0]


def test_agrpo_stale_share_comes_from_its_summary_else_its_metrics(tmp_path):
    rows = [{"sample/trained": 64, "sample/dropped_stale_total": 0, "perf/mfu": 0.9},
            {"sample/trained": 64, "sample/dropped_stale_total": 8, "perf/mfu": 0.2},
            {"sample/trained": 64, "sample/dropped_stale_total": 8, "perf/mfu": 0.4}]
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"dropped_stale_share": 0.05, "samples_generated": 240, "samples_trained": 192}))
    assert vs_trl.agrpo_extra(rows, summary) == {"stale_share": 0.05, "generated_per_trained": 1.25,
                                                 "mfu": pytest.approx(0.3)}  # the first step's mfu left out
    summary.write_text(json.dumps({"dropped_stale_share": float("nan")}))
    out = vs_trl.agrpo_extra(rows, summary)
    assert out["stale_share"] == pytest.approx(8 / 200) and out["generated_per_trained"] == pytest.approx(200 / 192)
    assert vs_trl.agrpo_extra([], tmp_path / "absent.json") == {}


def test_gpu_peaks_reads_nvidia_smi_lines():
    assert gpu_memory.gpu_peaks("0, 1024\n1, 512\n0, 40960\n1, 2048\ngarbage\n") == {
        "gpu_peak_gib": 40.0, "gpu_peak_gib_per_gpu": {"0": 40.0, "1": 2.0}}
    assert gpu_memory.gpu_peaks("") == {}


def test_a_run_cut_short_keeps_its_steps(tmp_path):
    out = tmp_path / "trl_seed0.jsonl"
    lines = [{"step": i, "t_launch": 60.0 + 10 * i, "t_train": 10.0 * i, "reward": 0.25 * i, "completion_len": 500.0,
              "completions": 64, "cuda_peak_gib": 50.0 + i} for i in (1, 2, 3)]
    out.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 4, "t_la')  # killed mid-line
    run = vs_trl._read_trl(out, vs_trl.Run("trl", 0, cut_short=True))
    assert run.steps == [(70.0, 10.0, 0.25), (80.0, 20.0, 0.5), (90.0, 30.0, 0.75)]
    assert run.tokens == [32000.0] * 3 and run.extra == {"torch_peak_gib": 53.0}
    assert vs_trl.numbers(run, vs_trl.TASKS["gpu-1.5b-long"])["cut_short"] is True
