"""The one config model: GRPO parameters at the top level, one section per service."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from agrpo.services.common import weight_transports

from .grpo import GRPOArgs
from .sections import (
    COMPILE_MIN_STEPS,
    AuthConfig,
    DatasetConfig,
    LauncherSection,
    PeftSection,
    RewardFunctionConfig,
    RewardSection,
    RolloutSection,
    TLSConfig,
    TrainerSection,
)


class AgrpoConfig(GRPOArgs):
    """Everything the three services need; each reads the shared part and its section."""

    model: str | None = None
    """Model path or id the trainer loads and vLLM serves (the vLLM model name too)."""
    tokenizer: str | None = None
    """Tokenizer path; None: the model's."""
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    """Prompt dataset (rollout)."""
    reward_funcs: list[RewardFunctionConfig] = Field(default_factory=list)
    """Reward functions, summed with their weights (reward service): {name, weight, kwargs}
    entries, or TRL's plain names (`[accuracy, my_module:my_reward]`)."""
    reward_weights: list[float] | None = None
    """TRL-style weights, one per reward function; overrides each function's weight."""
    tools: list[str] = Field(default_factory=list)
    """Tool functions by `module:callable` (rollout)."""
    environment_factory: str | dict[str, str] | None = None
    """Environment factory by `module:callable`, or a name -> factory map (rollout)."""
    log_format: str = Field("auto", pattern="^(auto|json|text)$")
    """Log lines as JSON (containers) or text (terminals); auto picks by TTY."""
    tls: TLSConfig = Field(default_factory=TLSConfig)
    """TLS for every gRPC server and client."""
    auth: AuthConfig = Field(default_factory=AuthConfig)
    """Bearer-token authentication for every gRPC server and client."""
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    """The trainer service."""
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    """The rollout service."""
    reward: RewardSection = Field(default_factory=RewardSection)
    """The reward service."""
    launcher: LauncherSection = Field(default_factory=LauncherSection)
    """What `agrpo run` starts and how."""
    peft: PeftSection | None = None
    """LoRA adapters, with peft's LoraConfig names and defaults (the Python API's peft_config);
    None: full fine-tuning. Only the adapter trains; a checkpoint keeps it in peft's format with
    its optimizer state. A weight sync sends the adapter alone into servers started with
    --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (agrpo run, the demo and `agrpo vllm
    --lora-rank` do), in the weight transport's payload, each version under its own adapter name;
    else (or for bias, modules_to_save, an embedding or head adapter) the adapted layers merged,
    with one warning. On several trainer ranks FSDP2 shards base and adapter, and rank 0 gathers
    what a sync sends. DoRA is refused."""
    sys_path: list[str] = Field(default_factory=list)
    """Folders put first on every service's sys.path before user code (reward functions, tools,
    environments) loads, as multiprocessing's spawn hands a child its parent's sys.path: the
    Python API passes its script's; agrpo run adds the folder of its config file."""
    run_id: str | None = None
    """Identity of one run: a trainer that finds its own run id in output_dir resumes it, even
    a finished run; another id starts a new run. agrpo run sets a new one per invocation
    (AGRPO_RUN_ID). Unset: the run in output_dir continues unless it finished."""

    @field_validator("reward_funcs", mode="before")
    @classmethod
    def _names_as_functions(cls, value):
        """TRL's form: a name or a list of names (`module:callable` or a built-in)."""
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            return [{"name": v} if isinstance(v, str) else v for v in value]
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> AgrpoConfig:
        if self.reward_weights is not None and len(self.reward_weights) != len(self.reward_funcs):
            raise ValueError(f"reward_weights has {len(self.reward_weights)} entries but "
                             f"reward_funcs has {len(self.reward_funcs)}")
        if self.queue_maxsize < self.samples_per_step():
            raise ValueError(f"queue_maxsize={self.queue_maxsize} holds less than one optimizer step "
                             f"({self.samples_per_step()} samples: per_device_train_batch_size x "
                             "gradient_accumulation_steps x trainer ranks, whole groups of num_generations)")
        if self.fp16 and self.bf16:
            raise ValueError("bf16 and fp16 are mutually exclusive")
        if self.environment_factory and self.dataset.path is None and self.max_steps <= 0:
            raise ValueError("environment_factory without dataset.path: the environment writes the "
                             "prompts, so max_steps > 0 must bound the run")
        if self.rollout.one_request_per_group and (self.tools or self.environment_factory):
            raise ValueError("rollout.one_request_per_group is for single-turn groups; with tools or "
                             "environment_factory each conversation turn is its own request")
        if self.trainer.weight_transport == "local" and (len(self.vllm_urls) != 1 or self.trainer.num_processes > 1):
            raise ValueError("trainer.weight_transport=local: the trainer serves generation itself at the one "
                             "vllm_server_base_url, from one trainer process (trainer.num_processes 1)")
        self._sync_keys_the_transport_reads()
        if self.use_liger_kernel:
            raise ValueError("use_liger_kernel: not supported (as in TRL's async trainer)")
        if self.lr_scheduler_type not in ("constant", "constant_with_warmup") and self.max_steps <= 0:
            raise ValueError(f"lr_scheduler_type: {self.lr_scheduler_type!r} decays over max_steps, "
                             "so it needs max_steps > 0")
        return self

    def _sync_keys_the_transport_reads(self) -> None:
        """A weight-sync key set (file, environment or flag) to other than its default, with a
        transport named that does not read it (services/common/weight_transports.py), is an
        error: it would do nothing. With weight_transport auto the transport is picked at run
        time, so nothing is refused."""
        t = self.trainer
        if t.weight_transport == "auto":
            return
        reads = weight_transports.reads(t.weight_transport)
        what = f"it reads: {', '.join(reads)}" if reads else "it reads none of the weight-sync keys"
        for key in weight_transports.SYNC_KEYS:
            value = getattr(t, key)
            if key in t.model_fields_set and key not in reads and \
                    value != type(t).model_fields[key].get_default(call_default_factory=True):
                shown = str(value).lower() if isinstance(value, bool) else value
                raise ValueError(f"trainer.{key}={shown} does nothing with trainer.weight_transport="
                                 f"{t.weight_transport} ({what})")

    @property
    def compiles(self) -> bool:
        """trainer.compile resolved: auto compiles a run of COMPILE_MIN_STEPS steps or more."""
        if self.trainer.compile is not None:
            return self.trainer.compile
        return self.max_steps <= 0 or self.max_steps >= COMPILE_MIN_STEPS

    @property
    def adapter_slots(self) -> int:
        """LoRA adapters a vLLM server must hold at once under adapter-only sync: the newest, every
        version a trainable sample may still be generated under, and the one being loaded."""
        return self.max_staleness + 2

    @property
    def resolved_output_dir(self) -> str:
        """output_dir with TRL's fallback."""
        return self.output_dir or "trainer_output"

    def max_model_len_for(self, model_limit: int | None) -> int:
        """The inference server's max_model_len: launcher.max_model_len, else the prompt room TRL
        advises (1024) plus max_completion_length, capped at the model's own limit."""
        wanted = self.launcher.max_model_len or 1024 + self.max_completion_length
        return min(wanted, model_limit) if model_limit else wanted

    def samples_per_step(self, ranks: int | None = None) -> int:
        """Samples one optimizer step trains: per_device_train_batch_size x gradient_accumulation_steps
        x the trainer's ranks (TRL GRPOTrainer's count), rounded up to whole groups of
        num_generations. `ranks` None: trainer.num_processes (0, one per visible GPU, counts as one
        here: only the trainer sees its GPUs and passes its world size)."""
        ranks = max(self.trainer.num_processes, 1) if ranks is None else ranks
        asked = self.per_device_train_batch_size * self.gradient_accumulation_steps * ranks
        return -(-asked // self.num_generations) * self.num_generations

    @property
    def resolved_max_inflight_tasks(self) -> int:
        """max_inflight_tasks with TRL 1.16's auto formula for -1: max(max_staleness, 1) x the
        samples of a step (samples_per_step; a torchrun of your own counts as one process: rollout
        cannot see those GPUs, so set max_inflight_tasks there). Pacing (trainer credits) bounds
        generation further; this caps vLLM concurrency."""
        if self.max_inflight_tasks > 0:
            return self.max_inflight_tasks
        return max(self.max_staleness, 1) * self.samples_per_step()
