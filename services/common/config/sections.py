"""Service sections of the config: what each service listens on, whom it calls, and how.

Each service reads the shared GRPO parameters plus its own section; the peers'
sections tell it where the others are (their `address`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agrpo.services.common import weight_transports
from agrpo.services.common.timeouts import RESTART_WINDOW_S

WeightTransportName = Literal[("auto", *weight_transports.NAMES)]  # type: ignore[valid-type]
"""auto or a registered transport (services/common/weight_transports.py)."""


class Section(BaseModel):
    """Base of every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


class TLSConfig(Section):
    """TLS for servers and clients; off by default (plaintext on localhost)."""

    enabled: bool = False
    """Serve and dial with TLS."""
    cert_file: Path | None = None
    """PEM certificate of this service (server side; client side for mTLS)."""
    key_file: Path | None = None
    """PEM private key matching cert_file."""
    ca_file: Path | None = None
    """PEM CA bundle: verifies servers (clients) and, with mTLS, clients (servers)."""
    require_client_auth: bool = False
    """mTLS: servers demand a client certificate signed by ca_file."""
    server_name_override: str | None = None
    """Client side: expected server name when it differs from the dialled host."""

    @model_validator(mode="after")
    def _files_when_enabled(self) -> TLSConfig:
        if self.enabled and not (self.cert_file and self.key_file):
            raise ValueError("tls.enabled needs tls.cert_file and tls.key_file")
        if self.require_client_auth and not self.ca_file:
            raise ValueError("tls.require_client_auth needs tls.ca_file")
        return self


class AuthConfig(Section):
    """Bearer-token authentication through gRPC metadata; off when no token is set."""

    token: str | None = None
    """Shared secret; callers send `authorization: Bearer <token>`."""
    token_file: Path | None = None
    """File holding the token (preferred over `token` in deployments)."""

    def resolve(self) -> str | None:
        """The token in force, read from token_file when given."""
        if self.token_file:
            return self.token_file.read_text().strip()
        return self.token


class ServiceSection(Section):
    """Where a service listens, where peers reach it, and its gRPC limits."""

    host: str = "127.0.0.1"
    """Interface to bind (0.0.0.0 in containers)."""
    port: int = Field(ge=0, le=65535)
    """gRPC port; 0 picks a free one (tests)."""
    address: str | None = None
    """How peers dial this service; None: localhost:<port>."""
    metrics_port: int | None = Field(None, ge=0, le=65535)
    """Prometheus /metrics port; None disables the endpoint, 0 picks a free one."""
    max_message_mb: int = Field(64, ge=1, le=2047)
    """Largest gRPC message sent or received, in MiB."""
    grace_s: float = Field(10.0, ge=0)
    """Seconds in-flight calls get to finish on SIGTERM."""

    @property
    def dial_address(self) -> str:
        """Address a client dials to reach this service."""
        return self.address or f"localhost:{self.port}"


class RewardFunctionConfig(Section):
    """One reward function: a built-in by name or a user function by `module:callable`."""

    name: str
    """Built-in name (accuracy, think_format, ...) or `package.module:callable`."""
    weight: float = 1.0
    """Weight of this function in the summed reward."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Parameters of a built-in factory (e.g. max_len for cosine_scaled)."""
    alias: str | None = None
    """Name under which results are reported (rewards/<alias>); None: derived."""


class RewardSection(ServiceSection):
    """The reward service."""

    port: int = Field(50053, ge=0, le=65535)
    metrics_port: int | None = Field(9103, ge=0, le=65535)
    num_workers: int = Field(2, ge=1)
    """Worker processes that run reward code. Under overload the gRPC front needs CPU too (about
    0.3 ms per call, refused or not): give the service two cores more than this
    (docs/reward-api.md, "Goodput under 10x overload")."""
    call_timeout_s: float = Field(10.0, gt=0)
    """Deadline of one reward function on one request; past it the worker is killed."""
    max_queue: int = Field(256, ge=1)
    """Requests admitted beyond num_workers (waiting for a worker); more is RESOURCE_EXHAUSTED."""
    max_items: int = Field(4096, ge=1)
    """Items in one request; more is INVALID_ARGUMENT."""
    start_method: Literal["forkserver", "spawn"] = "forkserver"
    """How worker processes start; forkserver preloads math-verify so a replacement is quick."""
    worker_start_timeout_s: float = Field(120.0, gt=0)
    """Time a worker gets to import and build the reward functions."""
    offer_builtins: bool = True
    """Also offer the parameter-free built-ins not in reward_funcs, to callers that name them."""


class RolloutSection(ServiceSection):
    """The rollout service."""

    port: int = Field(50052, ge=0, le=65535)
    metrics_port: int | None = Field(9102, ge=0, le=65535)
    scoring_retries: int = Field(3, ge=0)
    """Attempts to score a group before it is re-issued later."""
    scoring_deadline_s: float = Field(60.0, gt=0)
    """Deadline of one Score call to the reward service."""
    scoring_concurrency: int = Field(4, ge=1)
    """Groups scored at the same time (scoring runs off the generation path)."""
    reissue_delay_s: float = Field(5.0, ge=0)
    """Wait before re-issuing a prompt whose scoring kept failing."""
    one_request_per_group: bool = False
    """Single-turn: ask vLLM for a group's num_generations completions in one request (n = G)
    instead of one request each (TRL's way). vLLM's API server and rollout then handle G times
    fewer requests; a group holds its G request slots until its last completion ends, so its
    samples are staler under async. The CPU demo turns it on (docs/architecture.md, Pacing).
    vLLM 0.26's generate route answers only part of such a request (rollout then stops with one
    line): there, use it with generate_endpoint: completions."""
    generate_endpoint: Literal["auto", "generate", "completions"] = "auto"
    """vLLM route: auto prefers /inference/v1/generate (per-token weight versions)."""
    min_vllm_version: str = "0.22.0"
    """Oldest vLLM accepted: older servers lack the RL API (native 4-phase weight sync)."""
    request_retries: int = Field(3, ge=1)
    """Attempts (on any server) for one generation request before its group is re-issued."""
    server_backoff_s: float = Field(1.0, gt=0)
    """First back-off of a failing vLLM server; doubles while it keeps failing."""
    server_backoff_max_s: float = Field(30.0, gt=0)
    """Longest back-off of a failing vLLM server."""
    trainer_reconnect_s: float = Field(0.5, gt=0)
    """First back-off before reconnecting to the trainer; doubles up to 10 s."""
    heartbeat_interval_s: float = Field(5.0, gt=0)
    """Seconds between heartbeats to the trainer."""
    max_epochs: int | None = Field(None, ge=1)
    """Passes over the dataset to issue; None: ceil(num_train_epochs), unbounded with max_steps."""
    send_text: bool = True
    """Put decoded prompt and completion text in samples (for log_completions)."""
    tool_timeout_s: float = Field(30.0, gt=0)
    """Per-call timeout of a tool (multi-turn); a timeout becomes an error tool message."""


COMPILE_MIN_STEPS = 500
"""trainer.compile auto: compile when a run has at least this many steps, about where the
faster steps repay the compiles at the 0.5B-1.5B shapes (docs/vs-trl.md, Results on one H200)."""


class TrainerSection(ServiceSection):
    """The trainer service."""

    port: int = Field(50051, ge=0, le=65535)
    metrics_port: int | None = Field(9101, ge=0, le=65535)
    deadline_s: float = Field(30.0, gt=0)
    """Deadline of a unary call to the trainer (rollout's; reward calls have
    rollout.scoring_deadline_s)."""
    weight_transport: WeightTransportName = "auto"
    """How weights reach vLLM: auto picks nccl on GPU, http on CPU (agrpo run picks shared_path
    for a CPU vLLM it started itself: a file per version under output_dir, no base64 JSON; and
    ipc when vLLM shares the trainer's GPU). ipc: CUDA IPC on one GPU, loaded by our worker
    extension (always a direct load). local: no vLLM; the trainer serves generation itself at
    vllm_server_base_url from a copy of its model (launcher.generation trainer)."""
    lora_sync: Literal["auto", "adapter", "merged"] = "auto"
    """How a LoRA trainer (peft set) syncs. auto, as TRL: the adapter alone where every server
    runs with --enable-lora and can express it, else the adapted layers merged (one warning).
    adapter: the adapter alone or a one-line error at the first sync. merged: always the merged
    layers, and agrpo run starts vLLM without LoRA, so it generates without LoRA kernels (on one
    GPU, where a sync over CUDA IPC copies nothing, loading an adapter costs more than a full
    sync: docs/lora.md)."""
    weight_load: Literal["auto", "vllm", "direct"] = "auto"
    """How vLLM loads an update. vllm: its RL flow (start/finish, layerwise reload; any model).
    direct: our worker extension loads the tensors as-is (CUDA, unquantized; start vLLM with
    --worker-extension-cls agrpo_vllm_plugin.worker.AgrpoWorkerExtension). auto: direct where
    the server's extension agrees, else vllm."""
    weight_swap: bool = True
    """vLLM's flow with the http or shared_path transport: one request, and vLLM's engine core
    itself pauses, loads, resets its prefix cache, labels the version and resumes, between two
    scheduler steps (our vLLM plugin, agrpo_vllm_plugin/swap.py). False, or a server without the
    plugin: one HTTP call per phase, generation paused across all of them."""
    cpu_reload: Literal["auto", "layerwise"] = "auto"
    """How a CPU vLLM packs its layers again after an http or shared_path update (our plugin's
    cpu_http engine). auto: from unpacked weights it keeps between updates, for unquantized
    models (the same packed weights, about half the time; one more copy of the linear weights
    in vLLM's memory: docs/measurements/async-measurements.md, "The kept reload"); layerwise:
    vLLM's own reload, any model."""
    shared_weights_dir: Path | None = None
    """Folder vLLM can read, for the shared_path transport."""
    metrics_jsonl: Path | None = None
    """Step metrics file; None: <output_dir>/metrics.jsonl."""
    sync_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Dtype of weights on the wire (send the server's dtype); auto: the training dtype."""
    http_chunk_mb: int = Field(64, ge=1)
    """Largest safetensors chunk per /update_weights call (http transport), in MiB."""
    nccl_buffer_mb: int = Field(1024, ge=1)
    """Packed broadcast buffer of the nccl transport, in MiB: one broadcast per buffer's worth of
    tensors (the tensor that crosses the limit stays in its chunk). vLLM gets it as
    packed_buffer_size_bytes, so both sides cut the same chunks."""
    nccl_rendezvous: Literal["auto", "b64", "store", "vllm"] = "auto"
    """How the nccl transport sets up its communicator with vLLM. b64: the NCCL unique id in the
    init request (vLLM >= 0.30). store: the trainer hosts a TCPStore vLLM's workers dial (any
    version, no vLLM import). vllm: vLLM's own helper (imports vLLM in the trainer). auto: b64
    where the server takes it, else store."""
    nccl_master_address: str | None = None
    """Address of this host that vLLM's workers dial for the store and vllm rendezvous (the port
    is a free one, picked each time); None: this host's address on the route to the server."""
    nccl_timeout_s: float = Field(120.0, gt=0)
    """Timeout of each blocking nccl step (rendezvous, broadcast and the server's call beside it)
    and of the store rendezvous; past it the sync fails naming the phase."""
    max_samples_per_micro_batch: int | None = Field(None, ge=1)
    """Close a micro-batch after this many samples; None: only the token budget closes it (TRL)."""
    idle_flush_s: float | None = Field(None, gt=0)
    """Train a partial step after this long without a new sample; None: never, a step is always
    whole (the run's last step takes what the run has left to train)."""
    reconcile_interval_s: float = Field(10.0, gt=0)
    """While idle, how often to check vLLM weight labels and re-sync restarted servers."""
    credit_window: int | None = Field(None, ge=1)
    """Samples rollout may have between dispatch and training (the pacing window); None: what
    max_staleness + 1 versions consume (docs/architecture.md, "Pacing")."""
    reward_failure_patience: int = Field(3, ge=0)
    """Stop the run (one line naming the reward function and its last error) after this many
    consecutive steps where most samples got no usable reward; 0: train on regardless."""
    num_processes: int = Field(1, ge=0)
    """Trainer ranks on this node (one per GPU; gloo processes on CPU); 0: one per visible GPU.
    `agrpo trainer` starts them under torchrun itself (several nodes: torchrun's PET_NNODES,
    PET_NODE_RANK, PET_MASTER_ADDR; docs/multi-gpu.md). Rank 0 serves gRPC and plans each
    micro-batch over all ranks' rows; every rank trains its rows under FSDP2
    (services/trainer/ranks.py). Under a torchrun of your own, WORLD_SIZE decides."""
    fsdp: bool = False
    """Shard with FSDP2 even on one rank (the multi-rank code path on one GPU)."""
    cpu_offload: bool = False
    """FSDP2's CPU offload (implies the FSDP2 path): sharded parameters, gradients and AdamW
    state live in pinned CPU memory and the optimizer steps on CPU; the GPU holds activations
    and one layer's gathered weights. Slower steps for a model several times larger."""
    collective_timeout_s: float = Field(300.0, gt=0)
    """Timeout of every collective between trainer ranks: a hung rank becomes an error."""
    exit_when_done: bool = False
    """Exit once training is done (agrpo run sets it); otherwise keep serving status until stopped."""
    threads: int | None = Field(None, ge=1)
    """torch's intra-op threads in the trainer process; None: OMP_NUM_THREADS (agrpo run gives
    each process 1)."""
    schedule: Literal["auto", "async", "sync", "alternate"] = "auto"
    """async: generation runs up to max_staleness versions ahead of training, both at once. sync: the
    baseline schedule of TRL's GRPOTrainer: generate one step's samples, train, sync, then generate
    again. alternate: generation runs ahead as in async, but every vLLM server pauses (its requests
    kept) while the trainer computes a step and syncs, then resumes: on one GPU the two take turns
    instead of time-slicing it, and a step's long completions finish while the next step's groups
    start (verl's colocated async). auto: sync where the trainer generates itself (weight_transport
    local: generation and training take turns on the same cores, and overlapping them in one
    process only makes both wait; measured in docs/vs-trl.md), alternate where vLLM shares the
    trainer's GPU (weight_transport ipc: two processes time-slicing one GPU slow the trainer's step
    2-4x; docs/vs-trl.md, "One GPU at a real shape"), async everywhere else."""

    @property
    def resolved_schedule(self) -> Literal["async", "sync", "alternate"]:
        """The schedule in force (auto resolved)."""
        if self.schedule != "auto":
            return self.schedule
        if self.weight_transport == "local":
            return "sync"
        return "alternate" if self.weight_transport == "ipc" else "async"
    overlap_weight_sync: bool = True
    """async schedule, http and shared_path transports: the weights are snapshotted, then pushed
    into vLLM while the next step trains (the trainer waits for the snapshot only). The sync
    schedule and NCCL (which sends the live parameters) always push before the next step."""
    recompute_in_flight: bool = True
    """At a weight sync, requests in flight at vLLM are preempted and recomputed under the new
    weights (TRL's /pause semantics). False: they go on with the KV cache they have (PipelineRL's
    in-flight update); their later tokens come from the new weights, and the per-token version
    spans say so. vLLM cannot drop the prefix cache while they hold it, so rollout salts each
    prompt's cache with its dispatch version: no request reuses KV of other weights. Pacing does
    not count on it yet (at max_staleness 1 some samples go stale). The CPU demo turns it off:
    with one request per group async reached a good reward sooner without the recompute
    (docs/architecture.md, Pacing; the runs: docs/measurements/async-measurements.md)."""
    peak_tflops: float | None = Field(None, gt=0)
    """Accelerator peak TFLOP/s (bf16 dense: 989 on an H200) for perf/mfu and perf/hfu; None: not
    logged."""
    forward: Literal["auto", "tree", "unpacked"] = "auto"
    """Training forward: tree (prefix-tree rows, ancestor mask) or unpacked (one padded row per
    sample; same loss). auto: tree on GPU (flex_attention with the tree's block mask; with eager
    layers a row up to 4096 tokens takes the dense mask, which needs no compile), and on CPU for
    a model of 10M parameters or more; unpacked for a smaller model on CPU, whose step is op
    overhead that the dense tree mask adds to. Off CUDA a tree row over 4096 tokens goes
    unpacked (the dense mask grows with the row squared)."""
    profile_steps: tuple[int, int] | None = None
    """Profile training steps [first, last] (1-based, as logged) with torch.profiler: the host's
    and the device's time by op, and a timeline, under <output_dir>/profile/
    (services/trainer/profiling.py). None: no profiling."""

    compile: bool | None = None
    """On one GPU, torch.compile the decoder layers and the logprob head: faster steps for tens
    of seconds of compiles in the first steps (docs/gpu.md). False: eager modules (the tree's
    flex attention stays compiled for rows over 4096 tokens). None (auto): compile for a run of
    at least COMPILE_MIN_STEPS steps (or one sized in epochs), where the faster steps repay the
    compiles; a shorter run is over sooner eager (docs/vs-trl.md)."""

    @field_validator("profile_steps")
    @classmethod
    def _a_window(cls, window: tuple[int, int] | None) -> tuple[int, int] | None:
        if window is not None and not 1 <= window[0] <= window[1]:
            raise ValueError("profile_steps must be [first, last] with 1 <= first <= last")
        return window

    @model_validator(mode="after")
    def _ipc_loads_directly(self) -> TrainerSection:
        if self.weight_transport == "ipc" and self.weight_load == "vllm":
            raise ValueError("trainer.weight_transport=ipc loads through our worker extension: "
                             "trainer.weight_load must be auto or direct, not vllm")
        return self


class LauncherSection(Section):
    """What `agrpo run` starts and how (the services themselves ignore this section)."""

    generation: Literal["auto", "vllm", "trainer"] = "auto"
    """Who generates. vllm: a vLLM server (found or started, as `vllm` says). trainer: the
    trainer itself, from a copy of its model (trainer.weight_transport local): no vLLM to start
    and no weights in flight, which is faster for a small model on a CPU. auto: trainer when no
    vLLM answers at vllm_server_base_url, on a machine without a GPU, or with one GPU for a
    job too short to repay vLLM's start (agrpo/launcher/vllm_plan.py short_job: max_steps x
    max_completion_length <= 4000); else vllm."""
    vllm: Literal["auto", "start", "external"] = "auto"
    """auto: use the vLLM servers at vllm_server_base_url(s) when they answer, else start one on
    a localhost URL's port; start: always start one; external: never (fail if none answers)."""
    device: Literal["auto", "cpu", "gpu"] = "auto"
    """Where vLLM and the trainer run; auto: gpu when nvidia-smi lists a GPU."""
    vllm_gpu: str = "0"
    """CUDA device of the vLLM server it starts."""
    trainer_gpus: str | None = None
    """CUDA devices of the trainer's ranks (one per rank, e.g. '1,2'); None: the GPUs vLLM
    does not use, or vLLM's own on a one-GPU machine."""
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """vLLM's share of its GPU."""
    max_model_len: int | None = Field(None, ge=16)
    """vLLM's --max-model-len; None: 1024 + max_completion_length (TRL's advice: the prompt
    length plus max_completion_length)."""
    kv_cache_gib: float | None = Field(None, gt=0)
    """vLLM's KV cache; None: 0.5 GiB on CPU, 2 GiB on GPU."""
    vllm_args: list[str] = Field(default_factory=list)
    """Extra arguments for the `vllm serve` that agrpo run and agrpo demo start, after ours, so
    yours win (`--enforce-eager` drops the decode graphs vLLM replays on a GPU;
    `--no-enforce-eager` gives a LoRA job's vLLM its graphs)."""
    max_restarts: int = Field(3, ge=0)
    """Crashes of one service within restart_window_s that `agrpo run` restarts; one more
    stops the job with the service's last error."""
    restart_window_s: float = Field(RESTART_WINDOW_S, gt=0)
    """Window over which crashes are counted."""
    ready_timeout_s: float = Field(900.0, gt=0)
    """How long a service (or the vLLM it starts) may take to become ready."""


class PeftSection(Section):
    """LoRA adapters (`peft:` in YAML; the Python API's peft_config): peft's LoraConfig names and
    defaults. The trainer trains only the adapter (services/trainer/lora.py); how a sync carries it
    is AgrpoConfig.peft's docstring, and docs/lora.md."""

    r: int = Field(8, ge=1)
    """Rank of the adapter matrices."""
    lora_alpha: float = Field(8, gt=0)
    """Scale numerator: the update is lora_alpha / r x B A (lora_alpha / sqrt(r) with use_rslora)."""
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input while training."""
    target_modules: str | list[str] | None = None
    """Module names (or a regex, or 'all-linear') to adapt; None: peft's default for the model type."""
    exclude_modules: str | list[str] | None = None
    """Module names (or a regex) never adapted."""
    bias: Literal["none", "all", "lora_only"] = "none"
    """Which biases train besides the adapter."""
    use_rslora: bool = False
    """Rank-stabilised scaling (lora_alpha / sqrt(r))."""
    modules_to_save: list[str] | None = None
    """Modules trained in full beside the adapter (e.g. a new head)."""
    layers_to_transform: int | list[int] | None = None
    """Only these layer indices get adapters."""
    init_lora_weights: bool | Literal["gaussian"] = True
    """peft's initialisation: B = 0, so training starts from the base model."""
    task_type: Literal["CAUSAL_LM"] | None = None
    """Accepted for peft's spelling; the trainer always trains a causal LM."""

    def lora_kwargs(self) -> dict[str, Any]:
        """peft.LoraConfig's keyword arguments."""
        return self.model_dump(exclude={"task_type"})


class DatasetConfig(Section):
    """The prompt dataset, loaded with `datasets.load_dataset`."""

    path: str | None = None
    """Hub id, local folder, or a builder name (json, csv, parquet) with data_files."""
    name: str | None = None
    """Dataset configuration name."""
    split: str = "train"
    """Split to train on."""
    data_files: str | list[str] | dict[str, Any] | None = None
    """Files for the json/csv/parquet builders."""
    load_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Other `load_dataset` keyword arguments."""
    prompt_column: str = "prompt"
    """Column holding the prompt (text or messages)."""
