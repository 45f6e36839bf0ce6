"""The ``cpu_http`` weight-transfer engine (runs inside vLLM's worker process).

Each ``/update_weights`` call carries one chunk of HF-named tensors
(``model.layers.0.self_attn.q_proj.weight`` ...), either inline or as a path.
Chunks may be any partition of the state dict: vLLM's ``model.load_weights``
does the q/k/v and gate/up fusing itself. Between ``start_weight_update`` and
``finish_weight_update`` the CPU layers pack their weights again: by our kept reload
(agrpo_vllm_plugin/cpu_reload.py) where it is exact, else by vLLM's layerwise reload.
"""

import base64
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.logger import init_logger

logger = init_logger(f"vllm.{__name__}")  # under vLLM's logger: only it has a handler


@dataclass
class CpuHttpInitInfo(WeightTransferInitInfo):
    """Nothing to set up (no process group, no sockets).

    reload: "auto" packs the updated layers again from unpacked weights kept between
        updates where that is exact (cpu_reload.refusal), else as "layerwise": vLLM's own
        reload, for any model.
    note: free-form.
    """

    reload: str = "auto"
    note: str = ""


@dataclass
class CpuHttpUpdateInfo(WeightTransferUpdateInfo):
    """Exactly one of the two fields must be set.

    safetensors_b64: ``base64(safetensors.torch.save(chunk))`` sent in the JSON body.
    path: a ``.safetensors`` file, or a directory whose ``*.safetensors`` are all
        loaded, on the inference machine's disk (relative to the server's cwd).
    """

    safetensors_b64: str | None = None
    path: str | None = None


def _safetensors_files(path: str) -> list[Path]:
    p = Path(path)
    if p.is_file():
        return [p]
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"cpu_http: no .safetensors file at {path!r}")
    return files


class CpuHttpWeightTransferEngine(WeightTransferEngine[CpuHttpInitInfo, CpuHttpUpdateInfo]):
    """Loads weight chunks delivered over vLLM's HTTP dev endpoints into the model."""

    init_info_cls = CpuHttpInitInfo
    update_info_cls = CpuHttpUpdateInfo

    reload_mode = "auto"

    def init_transfer_engine(self, init_info: CpuHttpInitInfo) -> None:
        # The transport is the HTTP request (or the file) itself; only the reload is settled here.
        if init_info.reload not in ("auto", "layerwise"):
            raise ValueError(f"cpu_http: reload must be 'auto' or 'layerwise', not {init_info.reload!r}")
        self.reload_mode = init_info.reload
        if init_info.reload == "layerwise":  # the kept copy of the weights is of no more use
            self.model.__dict__.pop("_agrpo_kept_reload", None)

    def start_weight_update(self) -> None:
        kept = self._kept_reload()
        if kept is not None:
            kept.start()
            return
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        kept = self._kept_reload()
        if kept is not None:
            kept.finish(self.model_config.dtype)
            return
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def _kept_reload(self):
        """This model's KeptReload, or None for vLLM's layerwise reload (asked for, or the kept
        one would not be exact here; the reason is logged once)."""
        from . import cpu_reload

        if self.reload_mode == "layerwise":
            return None
        cached = getattr(self.model, "_agrpo_kept_reload", None)
        if cached is None:
            why = cpu_reload.refusal(self.model, self.model_config)
            cached = why or cpu_reload.KeptReload(self.model)
            logger.info("cpu_http: %s", f"vLLM's layerwise reload ({why})" if why else
                        "kept reload (updated layers packed again from unpacked weights kept in memory)")
            self.model._agrpo_kept_reload = cached
        return cached if isinstance(cached, cpu_reload.KeptReload) else None

    def update_weights(self, update_info: dict) -> None:
        # The base class ends with torch.accelerator.synchronize(), which has no
        # device to talk to on CPU; loading here is synchronous anyway.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: CpuHttpUpdateInfo) -> None:
        from safetensors.torch import load, load_file

        if (update_info.safetensors_b64 is None) == (update_info.path is None):
            raise ValueError("cpu_http: update_info needs exactly one of 'safetensors_b64' or 'path'")
        if update_info.safetensors_b64 is not None:
            self._load(load(base64.b64decode(update_info.safetensors_b64)).items())
        else:
            for f in _safetensors_files(os.path.expanduser(update_info.path)):
                self._load(load_file(str(f)).items())

    def _load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.model.load_weights(iter(named_tensors))

    def shutdown(self) -> None:
        pass
