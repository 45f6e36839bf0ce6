"""Hugging Face TRL 1.16.0's own `GRPOTrainer` on an agrpo task: the baseline of benchmarks/vs_trl.py.

Runs in .venv-trl (`scripts/setup_env.sh trl`), never in .venv: it imports nothing of agrpo
(`services`, `agrpo`, `gen`). The reward is loaded from a file path (`--reward-file
agrpo/demo/task.py --reward-func digit_share`), so both sides call the same source.
The prompts file holds rows {"prompt": [chat messages], "solution": ...}; TRL applies the
tokenizer's chat template (add_generation_prompt=True) and hands every extra column to the
reward as a keyword argument.

Output (--out, JSON lines): one line per optimizer step
    {"step", "t_launch", "t_train", "reward", "step_s", "completion_len", "completions", ...}
- t_launch: seconds since launch: since --t0 (a parent's time.time() before it started this
  process) or else since the timestamp taken as this file's first statement, before any import.
- t_train: seconds since trainer.train() was called.
- reward: TRL's logged `reward` of that step: with logging_steps=1 and one generation batch per
  optimizer step, GRPOTrainer appends one value per step to _metrics["train"]["reward"] (the
  nanmean over all num_generations x prompts_per_step completions of the weighted sum of the
  reward functions, weight 1), and log() averages that one-element list and clears it.
- step_s: wall time from the end of the previous step (for step 1: from on_train_begin) to the
  end of this one: generation + reward + forward/backward + optimizer step.
- gen_s: the part of step_s spent in GRPOTrainer._generate_and_score_completions (tokenize,
  generate, decode, reward, advantages); the rest is the loss forward/backward and the optimizer.
  (Measured by wrapping that method on the trainer instance; it changes nothing else.)
- completion_len: TRL's logged `completions/mean_length` (all completions of the generation batch,
  truncated ones included); completions: the generation batch (prompts_per_step x num_generations),
  so completion_len x completions is the completion tokens the step trained.
- cuda_peak_gib (CUDA only): torch.cuda.max_memory_allocated so far, in GiB. vLLM colocated runs in
  this process and allocates through torch's allocator, so its weights and KV cache count too.
and a last line {"event": "done", ...} with the totals, the versions, the effective settings and the
CUDA peaks (cuda_peak_gib, cuda_peak_reserved_gib).

Settings (TRL 1.16.0 GRPOConfig / transformers 5.19.0 TrainingArguments), checked against their
source in .venv-trl, each matched to agrpo's own (docs/vs-trl.md):

- per_device_train_batch_size = prompts_per_step x num_generations / --grad-accum (toy tasks:
  2 x 8 / 1 = 16): TRL counts completions, not prompts; one process, so 16 completions = 2 groups
  per optimizer step.
- num_generations = 8: the same G.
- gradient_accumulation_steps = steps_per_generation = --grad-accum (default 1; set explicitly;
  generation_batch_size left None, so __post_init__ makes it per_device_train_batch_size x 1
  process x GA = prompts_per_step x 8), num_iterations = 1: one generation batch per optimizer
  step, generated at once and trained in GA micro-batches, one pass over it. The long GPU tasks
  (64 completions of 512-1024 tokens) need GA > 1 to fit memory (benchmarks/vs_trl.py's Task
  says which and why). loss_type "dapo" normalises every micro-batch by the tokens of the whole
  generation batch (num_items_in_batch x GA / steps_per_generation), so the GA micro-batches'
  gradients add up to the one-batch gradient. With these, _generate_and_score_completions skips
  the old-logprob forward (generate_every = steps_per_generation x num_iterations = GA divides GA)
  and _compute_loss uses per_token_logps.detach() as the old logprobs (ratio 1, the on-policy
  case) - except with use_vllm, where vllm_importance_sampling_correction (TRL's default True,
  kept) computes them for the vLLM/trainer importance ratio.
- max_completion_length: the task's (tiny 24, smollm2 32, agrpo/demo/runner.py task_settings).
  TRL 1.16 has no max_prompt_length: prompts are never truncated (the field is gone from
  GRPOConfig; _tokenize_prompts applies the chat template with no truncation).
- temperature = 1.0, top_p = 1.0, top_k = 0: in TRL 1.16 top_k is an int and 0 is documented as
  "top-k filtering is disabled"; with use_vllm=False it goes into GenerationConfig(top_k=0), and
  transformers 5.19 adds TopKLogitsWarper only if top_k is not None and != 0
  (generation/utils.py). The explicit 0 is not replaced by the model's generation_config or the
  global default 50, which fill only fields left None (_prepare_generation_config). min_p stays
  None, repetition_penalty 1.0, do_sample True. The runner re-derives the merged config at
  start-up and records it in the done line ("generation"), and refuses to run if top-k/top-p/
  temperature filtering would be on.
- generation (use_vllm=False): model.generate with the KV cache (use_cache=True, transformers'
  default; gradient checkpointing is off, and TRL would disable it around generate anyway),
  cache_implementation None (dynamic cache), disable_compile=True, left padding, every eos id the
  model declares ends a completion; tokens after the first EOS are masked.
- learning_rate: the task's (tiny 3e-3, smollm2 2e-5); lr_scheduler_type "constant",
  warmup_steps 0 (TRL's default is linear decay; ours is constant).
- optim "adamw_torch_fused" (transformers' own default with torch >= 2.8): torch 2.13 has a fused
  AdamW kernel for CPU tensors too, so TRL gets fused AdamW on the CPU (agrpo's trainer falls back
  to plain AdamW on CPU: agrpo/services/trainer/model.py; the same maths with weight_decay 0).
  weight_decay 0, adam_beta1/beta2/epsilon 0.9/0.999/1e-8, max_grad_norm 1.0.
- beta = 0.0: no KL-to-reference term, and no reference model is loaded.
- loss_type "dapo": sum of per-token losses / tokens in the batch (num_items_in_batch spans the
  generation batch = the one micro-batch). epsilon 0.2 (epsilon_high None -> 0.2), token-level
  importance sampling.
- scale_rewards "group": advantages (r - group mean) / (group std + eps). NOT matchable exactly:
  TRL's eps is 1e-4 and its std is Bessel-corrected (nanstd, n - 1); the baseline doc says
  1e-8 - only groups with a near-zero std differ.
- mask_truncated_completions False: truncated completions are trained too.
- dtype: --dtype (float32 default) via model_init_kwargs; bf16 = False and fp16 = False
  explicitly (TRL's config defaults bf16 to True when fp16 is unset: mixed-precision autocast,
  also on the CPU, which would not be "the same arithmetic"). `--bf16` turns the autocast on,
  as agrpo's GPU trainer has it: gpu-smollm2 trains fp32 weights under bf16 autocast.
- gradient_checkpointing False (TRL's config defaults it to True); --grad-ckpt turns it on.
- disable_dropout False (TRL default; both models have dropout 0).
- threads: --threads sets OMP_NUM_THREADS/MKL_NUM_THREADS before torch is imported and
  torch.set_num_threads.
- logging_strategy "steps", logging_steps 1, report_to "none", save_strategy "no",
  eval_strategy "no", no tqdm/printer callback (the runner prints its own line per step);
  dataloader_pin_memory only with CUDA (on a CPU it does nothing but warn).
- seed: GRPOConfig.seed (TRL calls set_seed(seed) before loading the model and
  set_seed(seed, device_specific=True) after); the RepeatSampler shuffles the prompts with it.
- use_vllm / vllm_mode / vllm_gpu_memory_utilization / vllm_enable_sleep_mode /
  vllm_max_model_length: wired through, for the GPU machine (colocate: vLLM inside this process,
  max_num_seqs = per_device_train_batch_size x steps_per_generation, the whole generation batch at
  once); untested on the CPU. vllm_max_model_length None (default) is TRL's: the model config's
  limit; the long tasks pass prompt room + max_completion_length.

--check-config builds the GRPOConfig alone (no model, no data) and prints its recorded settings.
"""
_T_PROCESS_START = __import__("time").time()  # launch clock: before any import

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", required=True, help="a local Hugging Face model folder")
    p.add_argument("--prompts", required=True, help='JSONL rows {"prompt": [chat messages], "solution": ...}')
    p.add_argument("--reward-file", required=True, help="python file that defines the reward function")
    p.add_argument("--reward-func", required=True, help="name of the reward function in --reward-file")
    p.add_argument("--out", required=True, help="JSONL output, a line per optimizer step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-completion-length", type=int, default=24)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (TRL's bf16=True), as agrpo on a GPU")
    p.add_argument("--optim", default="adamw_torch_fused",
                   help="adamw_torch_fused (default; fused kernel exists on CPU with torch 2.13) or adamw_torch")
    p.add_argument("--t0", type=float, default=None,
                   help="launch clock (epoch seconds, time.time()) of a parent; default: this process's start")
    p.add_argument("--use-vllm", action="store_true", help="generate with vLLM (GPU only)")
    p.add_argument("--vllm-mode", default="colocate", choices=["colocate", "server"])
    p.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--vllm-enable-sleep-mode", action="store_true")
    p.add_argument("--vllm-max-model-length", type=int, default=None,
                   help="vLLM's context (colocate); default: the model config's limit (TRL's default)")
    p.add_argument("--grad-accum", type=int, default=1,
                   help="gradient_accumulation_steps = steps_per_generation: one generation batch of "
                        "prompts_per_step x num_generations per optimizer step, trained in this many micro-batches")
    p.add_argument("--grad-ckpt", action="store_true", help="gradient_checkpointing (off by default)")
    p.add_argument("--check-config", action="store_true", help="build the GRPOConfig, print its settings, exit")
    p.add_argument("--quiet", action="store_true", help="no line per step on stdout")
    args = p.parse_args(argv)
    if args.grad_accum < 1 or (args.prompts_per_step * args.num_generations) % args.grad_accum:
        p.error(f"--grad-accum {args.grad_accum} must divide prompts_per_step x num_generations "
                f"({args.prompts_per_step * args.num_generations})")
    return args


def load_reward(path: str, name: str):
    """The reward function `name` from the python file `path` (no package import needed)."""
    path = str(Path(path).resolve())
    spec = importlib.util.spec_from_file_location(f"_trl_runner_reward_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return getattr(module, name)


def load_rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


CONFIG_RECORDED = (
    "per_device_train_batch_size", "num_generations", "generation_batch_size", "gradient_accumulation_steps",
    "steps_per_generation", "num_iterations", "max_completion_length", "temperature", "top_p", "top_k",
    "learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2",
    "adam_epsilon", "max_grad_norm", "beta", "loss_type", "epsilon", "epsilon_high", "scale_rewards",
    "mask_truncated_completions", "bf16", "fp16", "gradient_checkpointing", "seed", "use_vllm", "vllm_mode",
    "vllm_gpu_memory_utilization", "vllm_importance_sampling_correction", "vllm_max_model_length",
    "vllm_enable_sleep_mode")
"""The GRPOConfig fields the done line records (the effective settings of the run)."""


def grpo_config(args: argparse.Namespace, out_dir: str, cuda: bool, **extra):
    """TRL's GRPOConfig with the matched settings (each one explained in the module docstring);
    `extra`: more fields (--check-config's use_cpu)."""
    from trl import GRPOConfig

    config = GRPOConfig(
        output_dir=out_dir,
        seed=args.seed,
        max_steps=args.steps,
        # batch: completions per optimizer step, one generation batch per step (in GA micro-batches),
        # one pass over it
        per_device_train_batch_size=args.prompts_per_step * args.num_generations // args.grad_accum,
        num_generations=args.num_generations,
        gradient_accumulation_steps=args.grad_accum,
        steps_per_generation=args.grad_accum,
        num_iterations=1,
        # sampling
        max_completion_length=args.max_completion_length,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        # optimizer and schedule
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim=args.optim,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        # objective
        beta=0.0,
        loss_type="dapo",
        epsilon=0.2,
        scale_rewards="group",
        mask_truncated_completions=False,
        # arithmetic
        model_init_kwargs={"dtype": args.dtype},
        bf16=args.bf16,
        fp16=False,
        gradient_checkpointing=args.grad_ckpt,
        # generation backend
        use_vllm=args.use_vllm,
        vllm_mode=args.vllm_mode,
        vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization,
        vllm_enable_sleep_mode=args.vllm_enable_sleep_mode,
        vllm_max_model_length=args.vllm_max_model_length,
        # bookkeeping: log every step, save and report nothing
        logging_strategy="steps",
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=cuda,  # the default (True) only warns on a CPU
        **extra,
    )
    assert config.generation_batch_size == args.prompts_per_step * args.num_generations, config.generation_batch_size
    return config


class StepRecorder:
    """Times each optimizer step and writes its line when TRL logs that step's metrics.

    `callback()` is the TrainerCallback TRL calls (built once transformers is imported);
    `time_generation` wraps the trainer's generate-and-score method to split each step."""

    def __init__(self, out, t0: float, quiet: bool, completions: int = 16, cuda: bool = False) -> None:
        self.out, self.t0, self.quiet = out, t0, quiet
        self.completions, self.cuda = completions, cuda
        self.clock: dict[str, float] = {}
        self.steps: list[dict] = []

    def callback(self):
        from transformers import TrainerCallback

        recorder = self

        class StepClock(TrainerCallback):
            def on_train_begin(self, a, state, control, **kw):
                recorder.clock["last_end"] = time.perf_counter()

            def on_step_end(self, a, state, control, **kw):
                recorder.step_ended()

            def on_log(self, a, state, control, logs=None, **kw):
                if logs and "reward" in logs:  # not the final train_runtime summary
                    recorder.write(state.global_step, logs)

        return StepClock()

    def train_called(self) -> None:
        self.clock["train_called"] = time.perf_counter()

    def step_ended(self) -> None:
        clock, now = self.clock, time.perf_counter()
        clock["step_s"], clock["last_end"] = now - clock["last_end"], now
        clock["t_train"] = now - clock["train_called"]
        clock["t_launch"] = time.time() - self.t0

    def write(self, step: int, logs: dict) -> None:
        clock = self.clock
        row = {"step": step, "t_launch": round(clock["t_launch"], 4),
               "t_train": round(clock["t_train"], 4), "reward": logs["reward"],
               "step_s": round(clock["step_s"], 4), "gen_s": round(clock.pop("gen_s", 0.0), 4),
               "reward_std": logs.get("reward_std"), "loss": logs.get("loss"),
               "completion_len": logs.get("completions/mean_length"), "completions": self.completions,
               "clipped_ratio": logs.get("completions/clipped_ratio")}
        if self.cuda:
            row["cuda_peak_gib"] = cuda_peaks()["cuda_peak_gib"]
        self.steps.append(row)
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()
        if not self.quiet:
            print(f"step {row['step']:4d} | reward {row['reward']:.3f} | {row['step_s']:.3f} s "
                  f"(gen {row['gen_s']:.3f}) | t_train {row['t_train']:7.2f} | t_launch {row['t_launch']:7.2f}",
                  flush=True)

    def time_generation(self, trainer) -> None:
        """Timing only (no change in behaviour): how long each step spends generating and scoring."""
        generate_and_score = trainer._generate_and_score_completions

        def timed_generate_and_score(*a, **kw):
            start = time.perf_counter()
            try:
                return generate_and_score(*a, **kw)
            finally:
                self.clock["gen_s"] = self.clock.get("gen_s", 0.0) + time.perf_counter() - start

        trainer._generate_and_score_completions = timed_generate_and_score


def checked_generation(trainer) -> dict:
    """What model.generate will really use (use_vllm=False): TRL's GenerationConfig merged with
    the model's generation_config and transformers' global defaults (fields left None are
    filled). Exits if it would filter tokens or not sample."""
    merged, _ = trainer.model._prepare_generation_config(trainer.generation_config)
    generation = {k: getattr(merged, k, None) for k in (
        "do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff",
        "repetition_penalty", "no_repeat_ngram_size", "max_new_tokens", "use_cache", "cache_implementation",
        "eos_token_id", "pad_token_id")}
    filtering = (generation["top_k"] not in (None, 0) or generation["top_p"] not in (None, 1.0)
                 or generation["temperature"] != 1.0 or generation["min_p"] is not None
                 or generation["typical_p"] not in (None, 1.0) or not generation["do_sample"]
                 or generation["repetition_penalty"] not in (None, 1.0))
    if filtering:
        raise SystemExit(f"trl_runner: generate would filter or not sample: {generation}")
    return generation


def cuda_peaks() -> dict:
    """torch's peak allocated and reserved CUDA memory in this process so far, GiB."""
    import torch

    return {"cuda_peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "cuda_peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2)}


def done_record(trainer, config, args, steps: list[dict], times: dict[str, float], generation: dict) -> dict:
    """The last line: totals, versions and the effective settings."""
    import torch
    import transformers
    import trl

    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # unwrap accelerate's wrapper
    step_times = [s["step_s"] for s in steps]
    return {"event": "done", "steps": len(steps),
            "t_launch": round(times["end"] - times["t0"], 4), "t_train": round(times["end"] - times["train"], 4),
            "import_s": round(times["imported"] - times["t0"], 4),
            "setup_s": round(times["setup"] - times["imported"], 4),
            "median_step_s": round(statistics.median(step_times), 4) if step_times else None,
            "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                         "torch": torch.__version__, "python": sys.version.split()[0]},
            "threads": torch.get_num_threads(),
            "settings": {k: getattr(config, k) for k in CONFIG_RECORDED}
            | {"optim": str(getattr(config.optim, "value", config.optim)), "dtype": args.dtype,
               "optimizer": type(optimizer).__name__, "fused": bool(optimizer.defaults.get("fused"))},
            "generation": generation, **(cuda_peaks() if torch.cuda.is_available() else {})}


def main(argv=None) -> int:
    args = parse_args(argv)
    times = {"t0": args.t0 if args.t0 is not None else _T_PROCESS_START}
    # Threads before torch is imported (OpenMP reads the variable once).
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, ProgressCallback
    from trl import GRPOTrainer

    torch.set_num_threads(args.threads)
    if args.check_config:
        cuda = torch.cuda.is_available()
        # bf16 autocast without CUDA: TrainingArguments wants use_cpu (for this check only)
        extra = {"use_cpu": True} if args.bf16 and not cuda else {}
        config = grpo_config(args, tempfile.mkdtemp(prefix="trl_runner_check_"), cuda, **extra)
        print(json.dumps({k: getattr(config, k) for k in CONFIG_RECORDED} | extra, default=str))
        return 0
    times["imported"] = time.time()
    reward_func = load_reward(args.reward_file, args.reward_func)
    dataset = Dataset.from_list(load_rows(args.prompts))
    out_dir = tempfile.mkdtemp(prefix="trl_runner_")  # TrainingArguments needs one; nothing is saved
    config = grpo_config(args, out_dir, torch.cuda.is_available())
    with open(args.out, "w") as out:
        recorder = StepRecorder(out, times["t0"], args.quiet, args.prompts_per_step * args.num_generations,
                                torch.cuda.is_available())
        trainer = GRPOTrainer(model=args.model, reward_funcs=reward_func, args=config, train_dataset=dataset,
                              callbacks=[recorder.callback()])
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        recorder.time_generation(trainer)
        generation = {} if args.use_vllm else checked_generation(trainer)
        times["setup"] = time.time()
        recorder.train_called()
        times["train"] = time.time()
        trainer.train()
        times["end"] = time.time()
        done = done_record(trainer, config, args, recorder.steps, times, generation)
        out.write(json.dumps(done, default=str) + "\n")
    if not args.quiet:
        print(json.dumps({k: v for k, v in done.items() if k not in ("settings", "generation")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
