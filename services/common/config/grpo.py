"""AsyncGRPOConfig parameters that agrpo implements, with TRL's names and defaults.

Flat, top-level keys of the config file, so a TRL user's settings carry over as they are.
Parameters agrpo accepts only at their default live in `compat.py`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

LrScheduler = Literal[
    "constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts",
    "polynomial", "inverse_sqrt", "cosine_with_min_lr", "warmup_stable_decay",
]
Optimizer = Literal["adamw_torch_fused", "adamw_torch", "adamw", "sgd", "adafactor"]


class GRPOArgs(BaseModel):
    """Training, generation and pipeline parameters shared by the three services."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)

    # Model
    model_init_kwargs: dict[str, Any] | None = None
    """Keyword arguments for `from_pretrained` when the trainer loads the model."""
    trust_remote_code: bool = False
    """Allow models and tokenizers that ship custom code."""
    router_aux_loss_coef: float = Field(0.001, ge=0)
    """Weight of the MoE load-balancing loss; no effect on dense models."""

    # Generation
    num_generations: int = Field(8, ge=1)
    """Completions sampled per prompt: the size of one GRPO group."""
    max_completion_length: int = Field(2048, ge=1)
    """Token budget of a completion; for multi-turn, of the whole conversation."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature; the trainer scales logits by it too."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass."""
    top_k: int = Field(0, ge=-1)
    """Top-k sampling; 0 (or -1) disables it."""
    min_p: float | None = Field(None, ge=0, le=1)
    """Minimum token probability relative to the most likely token."""
    repetition_penalty: float = Field(1.0, gt=0)
    """Penalty on tokens already in the prompt or completion (1.0 = none)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra keyword arguments for `apply_chat_template`."""
    max_tool_calling_iterations: int | None = Field(None, ge=0)
    """Tool-call turns per conversation; None: until no tool call or the budget is used."""
    fork_threshold_tokens: int = Field(1024, ge=0)
    """A re-rendered conversation drifting by fewer tokens is realigned, else forked."""

    # vLLM
    vllm_server_base_url: str = "http://localhost:8000"
    """Base URL of the vLLM server (use `vllm_server_base_urls` for several)."""
    vllm_server_timeout: float = Field(240.0, gt=0)
    """Seconds to wait for the vLLM server to become healthy at start."""
    request_timeout: int = Field(600, gt=0)
    """Seconds allowed for one generation request."""

    # Loss and batching
    epsilon: float = Field(0.2, ge=0)
    """Lower clip range of the importance ratio."""
    epsilon_high: float | None = Field(None, ge=0)
    """Upper clip range; None uses `epsilon`."""
    token_budget: int | None = None
    """Unique tokens per micro-batch row (memory: it never changes what a step trains); None: what
    the trainer's free memory holds (services/trainer/budget.py), never below the server's
    max_model_len; <= 0: fixed count (per_device_train_batch_size x ranks a micro-batch)."""

    # Async pipeline
    max_inflight_tasks: int = Field(-1, ge=-1)
    """Concurrent conversations; -1: max_staleness x batch x grad-accum x processes."""
    max_staleness: int = Field(4, ge=0)
    """Policy versions a sample may lag behind the trainer before it is dropped."""
    queue_maxsize: int = Field(1024, ge=1)
    """Samples buffered between rollout and the training loop."""
    weight_sync_steps: int = Field(1, ge=1)
    """Optimizer steps between weight syncs into vLLM."""
    heartbeat_stale_after_s: float = Field(300.0, gt=0)
    """A peer silent for longer is reported unhealthy."""

    # Logging
    log_completions: bool = False
    """Log a sample of (prompt, completion) pairs every `logging_steps`."""
    num_completions_to_print: int | None = Field(None, ge=0)
    """Completions printed per logging step; None: all."""
    logging_steps: float = Field(1, gt=0)
    """Steps between log lines (a float < 1 is a fraction of the total)."""
    logging_first_step: bool = False
    """Also log the first step."""
    report_to: str | list[str] = "none"
    """Trackers: none, all, tensorboard, wandb, trackio (used only when installed)."""
    run_name: str | None = None
    """Run name for trackers."""
    project: str = "huggingface"
    """Tracker project."""
    logging_dir: str | None = None
    """TensorBoard folder; None: <output_dir>/runs."""
    disable_tqdm: bool | None = None
    """Disable progress bars."""
    log_level: Literal["passive", "debug", "info", "warning", "error", "critical"] = "passive"
    """Log level; passive keeps agrpo's default (info)."""

    # Optimisation
    output_dir: str | None = None
    """Where checkpoints and metrics go; None: trainer_output."""
    per_device_train_batch_size: int = Field(8, ge=1)
    """Samples a rank trains per accumulation step: an optimizer step trains per_device_train_batch_size
    x gradient_accumulation_steps x ranks samples, whole groups (TRL GRPOTrainer's count), however
    the token budget cuts them into micro-batches."""
    num_train_epochs: float = Field(3.0, gt=0)
    """Passes over the prompt dataset, counted in distinct prompts trained."""
    max_steps: int = Field(-1, ge=-1)
    """Optimizer steps; > 0 overrides num_train_epochs."""
    learning_rate: float = Field(1e-6, ge=0)
    """Peak learning rate."""
    lr_scheduler_type: LrScheduler = "constant"
    """Schedule; decaying ones need an explicit max_steps."""
    lr_scheduler_kwargs: dict[str, Any] | None = None
    """Extra scheduler arguments."""
    warmup_steps: float = Field(0, ge=0)
    """Warmup steps (a float < 1 is a fraction of max_steps)."""
    warmup_ratio: float | None = Field(None, ge=0, le=1)
    """Warmup as a fraction of max_steps (deprecated in transformers; kept for configs)."""
    optim: Optimizer = "adamw_torch_fused"
    """Optimizer; fused AdamW falls back to plain AdamW where unavailable."""
    optim_args: str | None = None
    """Extra optimizer arguments as "k=v,k=v"."""
    weight_decay: float = Field(0.0, ge=0)
    """Decoupled weight decay."""
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    """Adam beta1."""
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    """Adam beta2."""
    adam_epsilon: float = Field(1e-8, gt=0)
    """Adam epsilon."""
    gradient_accumulation_steps: int = Field(1, ge=1)
    """Multiplies the samples of an optimizer step (see per_device_train_batch_size); the micro-batches
    it is trained in are cut by token_budget, and its loss is normalised over all its tokens."""
    average_tokens_across_devices: bool = True
    """Normalise the loss by tokens summed over ranks."""
    max_grad_norm: float = Field(1.0, ge=0)
    """Gradient clipping norm; 0 disables clipping."""
    bf16: bool | None = None
    """bf16 mixed precision; None: on where supported (not on CPU)."""
    fp16: bool = False
    """fp16 mixed precision."""
    tf32: bool | None = None
    """Allow TF32 matmuls on Ampere+ GPUs."""
    gradient_checkpointing: bool = True
    """Recompute activations in backward to save memory."""
    gradient_checkpointing_kwargs: dict[str, Any] | None = None
    """Arguments for gradient checkpointing."""
    torch_compile: bool = False
    """Compile the model with torch.compile."""
    use_liger_kernel: bool = False
    """Liger kernels (not supported: TRL's async trainer rejects them too)."""
    use_cache: bool = False
    """KV cache during training forward (off: training does not need it)."""
    use_cpu: bool = False
    """Train on CPU even when a GPU is present."""
    seed: int = 42
    """Seed for initialisation, dataset shuffling and sampling."""
    data_seed: int | None = None
    """Seed for dataset shuffling; None: seed."""
    save_strategy: Literal["no", "steps", "epoch", "best"] = "steps"
    """When to checkpoint."""
    save_steps: float = Field(500, gt=0)
    """Steps between checkpoints (a float < 1 is a fraction of the total)."""
    save_total_limit: int | None = Field(None, ge=1)
    """Checkpoints kept; older ones are deleted."""
    save_only_model: bool = False
    """Checkpoint the model only (no optimizer): such a checkpoint cannot resume."""
    resume_from_checkpoint: bool | str | None = None
    """true resumes the latest checkpoint in output_dir, a path that checkpoint, false starts a
    new run (the previous one in output_dir is moved aside, never deleted). Unset: an interrupted
    run continues (a trainer started again on an output_dir whose run did not finish, or with
    that run's run_id, resumes its latest checkpoint) and anything else starts a new run, as
    TRL's None does (agrpo run and the Python API set a new run_id per invocation)."""
    ignore_data_skip: bool = False
    """Kept for TRL parity; rollout resumes from the trainer's ledger instead."""

    # TRL 1.16.0 additions
    dtype: Literal["auto", "bfloat16", "float16", "float32", "float64"] = "float32"
    """Dtype the trainer loads the model in (TRL 1.16.0); bf16 autocast still applies. float64
    (ours, CPU only) for exactness checks: no rounding for a reordered sum to amplify."""
    weight_sync_timeout: float = Field(1800, gt=0)
    """Seconds allowed for one whole weight sync (TRL 1.16.0)."""

    # GRPOConfig's off-policy correction (not in AsyncGRPOConfig; names as GRPOConfig 1.16.0)
    vllm_importance_sampling_correction: bool = True
    """Correct for the trainer/vLLM mismatch (numerics and staleness) by importance sampling:
    the PPO ratio is taken against the trainer's own logprobs at step start and each term is
    weighted by pi_trainer / pi_vllm (docs/architecture.md, "Off-policy correction"). On by
    default, as in GRPOConfig; false gives TRL AsyncGRPO's loss (clip around vLLM's logprobs),
    which throws away most of what stale samples teach (docs/from-trl.md)."""
    vllm_importance_sampling_mode: Literal["token_truncate", "token_mask", "sequence_truncate",
                                           "sequence_mask"] = "token_truncate"
    """How the weights are formed: per token or per sequence; truncated to
    [clip_min, clip_max], or masked (weight 0, no gradient) outside it. GRPOConfig defaults to
    sequence_mask; under staleness a sequence's ratio is a product over its tokens and masks
    most sequences, so the default here is token_truncate."""
    vllm_importance_sampling_clip_max: float | None = Field(3.0, gt=0)
    """Upper bound of the importance weight (None: unbounded)."""
    vllm_importance_sampling_clip_min: float | None = Field(None, ge=0)
    """Lower bound of the importance weight (None: unbounded)."""
    vllm_importance_sampling_cap: float | None = Field(None, gt=0)
    """Deprecated in TRL 1.16.0: the same as vllm_importance_sampling_clip_max."""
    cast_lm_head_to_fp32: bool = False
    """Compute the trainer's logprobs with an fp32 LM head (less trainer/vLLM mismatch) when the
    weights are bf16 (`dtype: bfloat16`). With fp32 weights (the default) the head already runs
    in fp32 under bf16 autocast, and this changes nothing (docs/gpu.md, Trainer/vLLM mismatch)."""

    # agrpo extensions
    vllm_server_base_urls: list[str] | None = None
    """Several vLLM servers (data parallel); overrides vllm_server_base_url."""
    tis_cap: float | None = Field(None, gt=0)
    """Truncated importance sampling with this cap (shorthand for vllm_importance_sampling_correction,
    token_truncate, clip_max=tis_cap); None: off."""
    weight_sync_phase_timeout: float = Field(60.0, gt=0)
    """Seconds allowed for each HTTP phase of a weight sync (pause, start, update, ...)."""

    @property
    def vllm_urls(self) -> list[str]:
        """Every configured vLLM base URL, without trailing slashes."""
        urls = self.vllm_server_base_urls or [self.vllm_server_base_url]
        return [u.rstrip("/") for u in urls]

    @property
    def importance_sampling(self) -> tuple[str | None, float | None, float | None]:
        """(mode, clip_min, clip_max) of the correction in force; mode None: off."""
        if self.tis_cap is not None:
            return "token_truncate", None, self.tis_cap
        if not self.vllm_importance_sampling_correction:
            return None, None, None
        clip_max = self.vllm_importance_sampling_cap or self.vllm_importance_sampling_clip_max
        return self.vllm_importance_sampling_mode, self.vllm_importance_sampling_clip_min, clip_max

    @property
    def effective_epsilon_high(self) -> float:
        """Upper clip range in force."""
        return self.epsilon if self.epsilon_high is None else self.epsilon_high
