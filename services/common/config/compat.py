"""TrainingArguments parameters that AsyncGRPOConfig inherits and agrpo does not use.

They are accepted with TRL's defaults so an existing config loads; setting one to
anything else is an error that names it, rather than a setting silently ignored.
"""

from __future__ import annotations

from typing import Any

UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "optim_target_modules": None, "label_smoothing_factor": 0.0, "bf16_full_eval": False,
    "fp16_full_eval": False, "torch_compile_backend": None, "torch_compile_mode": None,
    "liger_kernel_config": None, "neftune_noise_alpha": None, "torch_empty_cache_steps": None,
    "auto_find_batch_size": False, "logging_strategy": "steps", "log_on_each_node": True,
    "logging_nan_inf_filter": True, "include_num_input_tokens_seen": "no",
    "log_level_replica": "warning", "trackio_space_id": None, "trackio_bucket_id": None,
    "trackio_static_space_id": None, "eval_strategy": "no", "eval_steps": None, "eval_delay": 0,
    "per_device_eval_batch_size": 8, "prediction_loss_only": False, "eval_on_start": False,
    "eval_do_concat_batches": True, "eval_use_gather_object": False,
    "eval_accumulation_steps": None, "include_for_metrics": [], "batch_eval_metrics": False,
    "save_on_each_node": False, "enable_jit_checkpoint": False, "push_to_hub": False,
    "hub_token": None, "hub_private_repo": None, "hub_model_id": None,
    "hub_strategy": "every_save", "hub_always_push": False, "hub_revision": None,
    "load_best_model_at_end": False, "metric_for_best_model": None, "greater_is_better": None,
    "restore_callback_states_from_checkpoint": False, "full_determinism": False,
    "accelerator_config": None, "parallelism_config": None, "dataloader_drop_last": False,
    "dataloader_num_workers": 0, "dataloader_pin_memory": True,
    "dataloader_persistent_workers": False, "dataloader_prefetch_factor": None,
    "remove_unused_columns": True, "label_names": None, "train_sampling_strategy": "random",
    "length_column_name": "length", "ddp_find_unused_parameters": None,
    "ddp_bucket_cap_mb": None, "ddp_broadcast_buffers": None, "ddp_static_graph": None,
    "ddp_backend": None, "ddp_timeout": 1800, "fsdp": None, "fsdp_config": None,
    "deepspeed": None, "debug": "", "skip_memory_metrics": True, "do_train": False,
    "do_eval": False, "do_predict": False, "local_rank": -1,
}
"""Name -> TRL default of each accepted-but-unused parameter."""


def check_unsupported(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Split off compat keys; return (remaining keys, errors for non-default values)."""
    errors, rest = [], {}
    for key, value in raw.items():
        if key not in UNSUPPORTED_DEFAULTS:
            rest[key] = value
        elif value != UNSUPPORTED_DEFAULTS[key]:
            errors.append(f"{key}: not supported by agrpo; only the default "
                          f"{UNSUPPORTED_DEFAULTS[key]!r} is accepted (got {value!r})")
    return rest, errors
