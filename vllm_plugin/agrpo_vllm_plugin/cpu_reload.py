"""Reload an unquantized model on vLLM's CPU backend without the layerwise machinery.

Why: after loading, vLLM's CPU linear layers pack their weight for a GEMM kernel (a oneDNN
handle, sgl or zentorch) and drop the unpacked tensor, so an update must load into fresh
tensors and pack again. vLLM's layerwise reload does that for any model: it rebuilds every
layer on the meta device, wraps every weight loader, counts each copy under a dispatch mode and
copies the results back, mostly Python bookkeeping; for a small model that costs more than the
packing itself, while vLLM's generation stands still (docs/measurements/async-measurements.md,
"The kept reload").

Here the unpacked tensors are kept between updates (one more copy of the linear weights), the
model's own loaders write into them, and each layer whose tensors changed is packed again by its
own ``process_weights_after_loading``: the calls vLLM makes at start-up, on the same values, so
the packed weights are the ones the layerwise reload would build. Only for models where that
holds (:func:`refusal`); anything else keeps the layerwise reload.
"""

from __future__ import annotations

import torch

_UNQUANTIZED = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod")


def refusal(model: torch.nn.Module, model_config) -> str:
    """Why the kept reload would not be exact for this model ("" when it is)."""
    if getattr(model_config, "quantization", None):
        return f"quantized model ({model_config.quantization})"
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is not None and type(method).__name__ not in _UNQUANTIZED:
            return f"{name}: {type(method).__name__}"
    try:
        device = next(model.parameters()).device
    except StopIteration:
        return "a model without parameters"
    return "" if device.type == "cpu" else f"device {device}"


class KeptReload:
    """start() before a model's ``load_weights`` calls, finish() after them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.kept: dict[torch.nn.Module, dict[str, torch.Tensor]] = {}
        """Per packed layer, the unpacked tensors its packing dropped, kept between updates."""
        self.dropped: dict[torch.nn.Module, dict[str, torch.Tensor]] = {}
        self.touched: set[torch.nn.Module] = set()

    def start(self) -> None:
        """Put every dropped tensor back, its loader marking the layer as written."""
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

        self.touched = set()
        for module in self._packed_layers():
            kept = self.kept.setdefault(module, {})
            for name, param in module.named_parameters(recurse=False):
                if name not in kept and param.numel() == 0:
                    kept[name] = _unpacked(module, name, get_layerwise_info(module))
                _mark_writes(kept.get(name, param), module, self.touched)
            self.dropped[module] = {name: module._parameters[name] for name in kept}
            for name, tensor in kept.items():
                module.register_parameter(name, tensor)

    def finish(self, act_dtype: torch.dtype) -> None:
        """Pack again each layer a loader wrote into; put the others back as they were. Then
        re-run the attention layers' own post-load step, as vLLM's reload does."""
        from vllm.model_executor.layers.attention import is_deferred_attention_layer

        for module in self._packed_layers():
            if module in self.touched:
                module.quant_method.process_weights_after_loading(module)
            else:
                for name, tensor in self.dropped.get(module, {}).items():
                    module.register_parameter(name, tensor)
        for module in self.model.modules():
            if is_deferred_attention_layer(module):
                module.process_weights_after_loading(act_dtype)

    def _packed_layers(self) -> list[torch.nn.Module]:
        return [m for m in self.model.modules() if type(getattr(m, "quant_method", None)).__name__ in _UNQUANTIZED]


def _mark_writes(tensor: torch.Tensor, module: torch.nn.Module, touched: set) -> None:
    """Wrap the tensor's weight loader (once) so a write adds its layer to `touched`."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    loader = getattr(tensor, "weight_loader", default_weight_loader)
    if getattr(loader, "agrpo_marks", None) is not None:
        loader.agrpo_marks[0] = touched
        return
    marks = [touched]

    def marking_loader(*args, **kwargs):
        marks[0].add(module)
        return loader(*args, **kwargs)

    marking_loader.agrpo_marks = marks
    tensor.weight_loader = marking_loader


def _unpacked(module: torch.nn.Module, name: str, info) -> torch.nn.Parameter:
    """A real tensor in the shape and with the loader the layer had before packing, from the
    metadata vLLM recorded at start-up for its own reload."""
    from vllm.model_executor.model_loader.reload.meta import materialize_meta_tensor
    from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs

    meta = info.restore_metadata[0].get(name)
    if meta is None:
        raise RuntimeError(f"{type(module).__name__}.{name}: vLLM recorded no shape to reload it into")
    with info.restore_device:
        tensor = materialize_meta_tensor(restore_layer_refs(meta, module))
    # A layerwise reload leaves its buffering wrapper on the recorded loader (it wraps the
    # metadata's tensors themselves); loads through it would never reach this tensor.
    loader = getattr(tensor, "weight_loader", None)
    while loader is not None and getattr(loader, "__name__", "") == "online_process_loader":
        loader = loader.__wrapped__
    if loader is not None:
        tensor.weight_loader = loader
    return tensor
