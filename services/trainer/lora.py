"""LoRA on the trainer's model (config `peft:`): attach an adapter, publish it, save and restore it.

Why in place: peft's inject_adapter_in_model swaps each targeted Linear for a LoRA layer inside
the HF model, so the module tree that the engine, the compiler and the generator walk
(model.model.layers...) stays as it is, and only the adapter's tensors require grad.

What a weight sync sends: to a server that takes adapters at run time, the adapter alone
(`adapter_tensors`, weight_sync/adapter_sync.py); otherwise, since vLLM serves the base model it
loaded at its start, each adapted layer's base weight with its adapter merged in (W + scale x B A)
under the base model's name, plus any other tensor that trains (biases with bias != none,
modules_to_save), never the frozen rest (`merged_weights`). The merge is out of place: the
trainer's base weights are never written, so nothing drifts however many versions are published.

Checkpoints hold the adapter in peft's own format (adapter_config.json and
adapter_model.safetensors), so `PeftModel.from_pretrained(base, checkpoint)` reads one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agrpo.services.common.preflight import StartupError

from .weight_sync.transports import hf_name

ADAPTER = "default"
"""peft's adapter name: the trainer trains one adapter."""
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
"""What PeftModel puts before a tensor's name in an adapter file."""
_WRAPPERS = (".base_layer", "modules_to_save.default.")
_ADAPTER_TENSORS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.", ".lora_magnitude_vector.")


def attach(model: torch.nn.Module, section, adapter_dir: str | Path | None = None) -> torch.nn.Module:
    """Inject a LoRA adapter as `section` (the config's PeftSection) says; its weights from
    `adapter_dir` (a checkpoint) when given, else peft's initialisation (B = 0: the base model)."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(task_type="CAUSAL_LM", **section.lora_kwargs())
    try:
        model = inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as exc:  # the config's fault, not the model's: name the key
        raise StartupError(f"peft.target_modules={section.target_modules!r}: {str(exc).splitlines()[0]}") from None
    if not any(True for _ in adapted_layers(model)):
        raise StartupError(f"peft.target_modules={section.target_modules!r} matches no layer of the model")
    if adapter_dir is not None:
        load_adapter(model, adapter_dir)
    return model


def has_adapter(model: torch.nn.Module) -> bool:
    """Whether `model` carries a LoRA adapter (attach ran: peft's injection sets peft_config);
    no peft import for a model without one."""
    return ADAPTER in (getattr(model, "peft_config", None) or {})


def adapted_layers(model: torch.nn.Module):
    """(name, LoRA layer) for every layer that carries the adapter."""
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            yield name, module


def base_name(name: str) -> str:
    """A tensor's name in the base model (what vLLM loads): wrapper and peft infixes removed."""
    name = hf_name(name)
    for infix in _WRAPPERS:
        name = name.replace(infix, "")
    return name


def merged_weights(model: torch.nn.Module, dtype: torch.dtype | None = None,
                   params: dict[str, torch.Tensor] | None = None) -> list[tuple[str, torch.Tensor]]:
    """What a sync sends: each adapted layer's weight with the adapter merged in
    (W + scaling x B A), then every other trainable tensor, under base-model names; optionally
    cast. params: the model's parameters by name, whole (a sharded model's, gathered); None:
    its own."""
    params = params if params is not None else dict(model.named_parameters())
    out = []
    with torch.no_grad():
        for name, layer in adapted_layers(model):
            delta = params[f"{name}.lora_B.{ADAPTER}.weight"] @ params[f"{name}.lora_A.{ADAPTER}.weight"]
            delta = (delta.T if layer.fan_in_fan_out else delta) * layer.scaling[ADAPTER]
            out.append((base_name(f"{name}.weight"), params[f"{name}.base_layer.weight"] + delta))
        for name, p in model.named_parameters():
            if p.requires_grad and not any(t in name for t in _ADAPTER_TENSORS):
                out.append((base_name(name), params[name].detach()))
    return [(n, (t if dtype is None else t.to(dtype)).contiguous()) for n, t in out]


def save_adapter(model: torch.nn.Module, folder: str | Path, base_model: str | None,
                 tensors: list[tuple[str, torch.Tensor]] | None = None) -> None:
    """adapter_config.json and adapter_model.safetensors in `folder`, in peft's format.
    tensors: `adapter_tensors`' result when already gathered (a sharded model); None: the model's."""
    from safetensors.torch import save_file

    config = model.peft_config[ADAPTER]
    config.base_model_name_or_path = base_model
    config.save_pretrained(str(folder))
    tensors = adapter_tensors(model) if tensors is None else tensors
    save_file({n: t.cpu() for n, t in tensors}, str(Path(folder) / ADAPTER_WEIGHTS), metadata={"format": "pt"})


def load_adapter(model: torch.nn.Module, folder: str | Path) -> None:
    """Put a saved adapter's weights into the injected one (one-line error when they do not fit)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(folder) / ADAPTER_WEIGHTS))
    try:
        result: Any = set_peft_model_state_dict(  # torch's load_state_dict result (typed loosely by peft)
            model, {k.removeprefix(PEFT_PREFIX): v for k, v in state.items()}, adapter_name=ADAPTER)
    except RuntimeError as exc:  # shapes differ: another r or target set
        raise ValueError(f"{folder}: the adapter does not fit the peft config (saved with another r?)") from exc
    missing = [k for k in result.missing_keys if any(t in k for t in _ADAPTER_TENSORS)]
    if missing or result.unexpected_keys:
        raise ValueError(f"{folder}: the adapter does not fit the peft config "
                         f"({len(missing)} tensors missing, {len(result.unexpected_keys)} unexpected)")


def is_adapter_dir(path: str | Path) -> bool:
    """Whether a folder holds a saved adapter (a LoRA checkpoint)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_tensors(model: torch.nn.Module, dtype: torch.dtype | None = None,
                    params: dict[str, torch.Tensor] | None = None) -> list[tuple[str, torch.Tensor]]:
    """The adapter's tensors (and any other trainable ones) under peft's file names, on their
    device, optionally cast: what an adapter-only sync sends and a checkpoint saves. params:
    the trainable parameters by name, whole (a sharded model's, gathered); None: the model's own."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, state_dict=params, adapter_name=ADAPTER)
    return [(PEFT_PREFIX + k, (v.detach() if dtype is None else v.detach().to(dtype)).contiguous())
            for k, v in state.items()]


def adapter_config_json(model: torch.nn.Module, base_model: str | None) -> str:
    """The adapter's adapter_config.json, as peft writes it."""
    import json

    config = model.peft_config[ADAPTER].to_dict()
    config["base_model_name_or_path"] = base_model
    return json.dumps(config, default=lambda o: sorted(o) if isinstance(o, (set, frozenset)) else str(o))


def adapter_sync_blocker(model: torch.nn.Module, section) -> str | None:
    """Why vLLM could not serve this adapter as an adapter (so the merged layers are synced
    instead), or None: vLLM's LoRA takes plain adapters on linear layers only."""
    if section.bias != "none":
        return f"peft.bias={section.bias}"
    if section.modules_to_save:
        return "peft.modules_to_save"
    embedded = [n for n, _ in adapted_layers(model) if n.split(".")[-1] in ("embed_tokens", "lm_head")]
    if embedded:
        return f"an adapter on {embedded[0]}"
    return None
