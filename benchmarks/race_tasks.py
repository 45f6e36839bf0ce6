"""The races of benchmarks/vs_trl.py: what each task trains, and what each side is given for it (TRL's
settings for a task are written down beside it, with why)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    """One race: what both sides train and the thresholds that count."""

    name: str
    demo_model: str  # agrpo demo --model
    steps: int
    thresholds: tuple[float, ...]
    window: int
    reward: str  # a function of agrpo/demo/task.py
    gpu: bool = False
    demo_args: tuple[str, ...] = ()
    dtype: str = "bfloat16"
    """GPU tasks: the weights' dtype on both sides (fp32 weights train under bf16 autocast).
    SmolLM2 learns at lr 2e-5 only in fp32: in bf16 such updates round away (neither side did)."""
    demo_task: str = "auto"
    """agrpo demo --task (its prompts and reward; auto: the model's own)."""
    completions_per_step: int = 16
    """Both sides: completions an optimizer step trains, in groups of 8 (agrpo:
    per_device_train_batch_size, which counts completions as TRL's does)."""
    max_completion_length: int | None = None
    """None: the demo task's own (agrpo/demo/runner.py DEMO_TASKS); else --set on agrpo's side."""
    num_prompts: int = 64
    """Prompts in the generated dataset both sides read (agrpo demo --num-prompts)."""
    trl_grad_accum: int = 1
    """TRL: gradient_accumulation_steps = steps_per_generation, per_device_train_batch_size =
    completions_per_step / this: one generation batch an optimizer step, in this many micro-batches."""
    trl_grad_ckpt: bool = False
    """TRL: gradient_checkpointing."""
    vllm_max_model_len: int | None = None
    """TRL's colocated vLLM: vllm_max_model_length (None: TRL's default, the model config's limit)."""

    def shape_args(self) -> list[str]:
        """What agrpo demo gets beyond --model for this task's shape: only what differs from the
        demo's defaults (the toy tasks get nothing), as a user would pass it."""
        out = [] if self.demo_task == "auto" else ["--task", self.demo_task]
        out += [] if self.num_prompts == 64 else ["--num-prompts", str(self.num_prompts)]
        if self.completions_per_step != 16:
            out += ["--set", f"per_device_train_batch_size={self.completions_per_step}"]
        if self.max_completion_length is not None:
            out += ["--set", f"max_completion_length={self.max_completion_length}"]
        return out


TASKS = {
    "tiny": Task("tiny", "tiny", 80, (0.5, 0.9), 10, "digit_share"),
    "smollm2": Task("smollm2", "smollm2", 20, (0.6,), 5, "final_answer"),
    # vllm_max_model_len 1024: what TRL's vLLM took from the shaped models' config before their limit
    # was raised to Qwen2.5's 32768 for the long task (agrpo/demo/runner.py SHAPED_POSITIONS).
    "gpu-0.5b": Task("gpu-0.5b", "0.5b", 80, (0.5, 0.9), 10, "digit_share", gpu=True, vllm_max_model_len=1024),
    "gpu-1.5b": Task("gpu-1.5b", "1.5b", 80, (0.5, 0.9), 10, "digit_share", gpu=True, vllm_max_model_len=1024),
    "gpu-smollm2": Task("gpu-smollm2", "smollm2", 40, (0.6,), 5, "final_answer", gpu=True, dtype="float32"),
    # The toy 1.5B task's reward, lr (1e-4) and thresholds at a realistic shape: 64 completions of up to
    # 1024 tokens a step. TRL: GA 8 (micro-batches of 8), no gradient checkpointing. The arithmetic, for
    # one 80 GB H100 (79.1 GiB) with vLLM colocated at 0.3: a step's fixed memory is bf16 weights, grads
    # and AdamW's two bf16 moments, 4 x 2.6 GB = 9.8 GiB, plus vLLM's 0.3 x 79.1 = 23.7 GiB: 33.5 GiB.
    # Activations of an eager Qwen2 layer without checkpointing, bf16, per token: the two RMSNorms' fp32
    # inputs and bf16 outputs (2 x 6h B), q, k, v (k and v repeated to 12 heads for SDPA) and the output
    # (4 x 2h B), the MLP's gate, up, SiLU and product (4 x 2I B): 20h + 8I = 100 KiB at h 1536, I 8960;
    # x 28 layers = 2.73 MiB a token (TRL 1.16's fused LM head never makes the logits, and the vocab is
    # 1024 anyway). Calibration, TRL 1.16 on one H100 at 448 tokens: GA 8 peaked at 44 GiB = 33.5 +
    # 8 x ~475 tokens x 2.73 MiB (10.1 GiB), and GA 1 (64 x 475 x 2.73 MiB = 81 GiB of activations)
    # ran out of memory. At 1024 tokens a row is up to 1042 tokens (a 17-18-token prompt; TRL pads a
    # micro-batch to its longest): GA 8 holds 8 x 1042 x 2.73 MiB = 22.2 GiB, a 56 GiB peak, 23 GiB to
    # spare; GA 4 would hold 44.4 GiB, a 78 GiB peak: no. Checkpointing would let GA 1 fit (each layer's
    # input only, 28 x 3 KiB a token, plus one layer recomputed: ~12 GiB) but costs a second forward
    # (~1.33x the FLOPs) where GA 8's micro-batches of ~8.3k tokens already fill the GPU, so GA 8 without
    # it is the faster of the choices that fit. (The GA 16 of keeping 448 tokens' micro-batch size would
    # fit too, at ~45 GiB, with half-size matmuls.) If GA 8 runs out of memory after all:
    # --trl-grad-accum 16.
    "gpu-1.5b-long": Task("gpu-1.5b-long", "1.5b", 60, (0.5, 0.9), 10, "digit_share", gpu=True,
                          completions_per_step=64, max_completion_length=1024, trl_grad_accum=8,
                          vllm_max_model_len=2048),
    # SmolLM2-135M on word problems of 1 to 4 operations (agrpo/demo/task.py word_problem): answers of
    # one line to several, 64 completions of up to 512 tokens a step, 512 prompts (8 a step: 60 steps
    # see each about once, so the reward measures solving, not remembering 64 answers); final_answer,
    # lr 2e-5 as for the sums. Thresholds, trailing-5 reward: 0.15, 0.2 and, as a stretch, 0.3. Before
    # training (SmolLM2 on the CPU, these prompts and chat template, temperature 1, 320 tokens, 16 samples
    # per operation count) it scores 0.08: 0.19 on one operation, 0.06 on two and three, 0 on four; greedy,
    # it gets 2 of 8 one-operation problems and 0 of 8 two-operation ones (it often answers with the first
    # number given: "The final answer is 6"). A trailing-5 mean (40 prompts, 320 samples) varies by about
    # 0.02 around that start. What GRPO can teach it within 60 steps is mostly what it taught on the sums
    # (end on the computed number, stop rambling: 31% of those samples ran to 320 tokens), on the one- and
    # some two-operation problems: 0.15 is that format learnt (about 2x the start, 3-4 standard errors
    # above it), 0.2 the one-operation problems mostly right, 0.3 most one- and two-operation problems and
    # some longer ones (plausible, not sure, at 135M in 60 steps). The toy task's 0.6 is out of reach here.
    # TRL: GA 2 (micro-batches of 32). The arithmetic: fp32 weights, grads and AdamW moments, 4 x 0.54 GB
    # = 2.0 GiB, plus vLLM's 23.7 GiB: 25.7 GiB fixed. Activations under bf16 autocast with an fp32
    # residual stream, per token and layer: the norms' fp32 inputs and outputs (2 x 8h B), autocast's bf16
    # copies of each projection's input (5 x 2h B), q, k, v (repeated from 3 to 9 heads) and the output
    # (4 x 2h B), the MLP's 4 x 2I B: 34h + 8I = 31 KiB at h 576, I 1536; x 30 layers = 0.91 MiB a
    # token. Its 49k vocabulary would be 96 KiB a token of bf16 logits (fp32 in the loss: more) but
    # TRL 1.16 scores through a fused, chunked LM head (add_fused_lm_head: the logits are never made
    # whole). A row is up to ~600 tokens (a 58-92-token prompt with the chat template + 512). GA 2: 32 x 600
    # x 0.91 MiB = 17 GiB, a 43 GiB peak. GA 1 would be 34 GiB, a 60 GiB peak: on paper it fits, but this
    # estimate has no measurement behind it (the 1.5B's has) and 19 GiB is the only margin for autocast's
    # casts, the allocator's fragmentation across varying widths and the backward's transients, while a
    # second micro-batch of 19k tokens costs a 135M model little. Gradient checkpointing: not needed.
    "gpu-smollm2-long": Task("gpu-smollm2-long", "smollm2", 60, (0.15, 0.2, 0.3), 5, "final_answer", gpu=True,
                             dtype="float32", demo_task="word-problems", completions_per_step=64,
                             max_completion_length=512, num_prompts=512, trl_grad_accum=2,
                             vllm_max_model_len=1536),
}
# vllm_max_model_len (TRL's colocated vLLM): must hold a prompt and the longest completion; 1024 of
# prompt room + max_completion_length, the rule agrpo's launcher starts its own vLLM with
# (AgrpoConfig.max_model_len_for). Sleep mode (vllm_enable_sleep_mode) stays off, TRL's default: at
# 0.3 of the GPU, vLLM leaves the training step the room the arithmetic above needs, and sleeping
# would free vLLM's memory during the step only to pay for it at every generation (level 2 drops the
# weights and the KV cache: a wake-up reallocates both and reloads the weights, every step).
AGRPO_VARIANTS = {"agrpo": [], "agrpo-sync": ["--set", "trainer.schedule=sync"],
                  "agrpo-async": ["--set", "trainer.schedule=async"],
                  "agrpo-vllm": ["--set", "launcher.generation=vllm"],
                  "agrpo-trainer": ["--set", "launcher.generation=trainer"]}
