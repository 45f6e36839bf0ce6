"""How tensors reach a vLLM server during the `update` phase (CPU transports).

- http: safetensors chunks, base64 in the JSON body of /update_weights (our vLLM
  plugin's `cpu_http` backend: update_info {"safetensors_b64": ...}).
- shared_path: one safetensors file per version under a folder the servers read
  (update_info {"path": ...}); the last `keep` versions stay on disk.

`prepare` (blocking, run in a thread) serialises once per version; `send` replays the
prepared payload to any number of servers, so N servers cost one serialisation.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import torch

from .base import Prepared, WeightTransport
from .client import VLLMAdmin

_PREFIXES = ("module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def hf_name(name: str) -> str:
    """Parameter name as vLLM's load_weights expects (wrapper prefixes stripped)."""
    for p in _PREFIXES:
        name = name.replace(p, "")
    return name


def named_weights(model: torch.nn.Module, dtype: torch.dtype | None = None) -> list[tuple[str, torch.Tensor]]:
    """Trainable parameters in named_parameters order, detached, contiguous, optionally cast."""
    out = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        t = p.detach()
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        out.append((hf_name(name), t.contiguous()))
    return out


def manifest(named: list[tuple[str, torch.Tensor]]) -> dict[str, list]:
    """{names, dtype_names, shapes} in send order."""
    return {"names": [n for n, _ in named],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in named],
            "shapes": [list(t.shape) for _, t in named]}


def gpu_uuid(device: torch.device | None = None) -> str:
    """The physical GPU's UUID: the same for every process on it, whatever CUDA_VISIBLE_DEVICES."""
    return str(torch.cuda.get_device_properties(device or torch.cuda.current_device()).uuid)


def split_by_bytes(named: list[tuple[str, torch.Tensor]], limit: int) -> list[list[tuple[str, torch.Tensor]]]:
    """Consecutive chunks of at most `limit` bytes (a bigger tensor is a chunk alone)."""
    chunks: list[list[tuple[str, torch.Tensor]]] = []
    cur: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named:
        n = t.numel() * t.element_size()
        if cur and size + n > limit:
            chunks.append(cur)
            cur, size = [], 0
        cur.append((name, t))
        size += n
    if cur:
        chunks.append(cur)
    return chunks


def cpu_init_info(reload: str) -> dict[str, str]:
    """init_info of our plugin's cpu_http engine: its default reload is left unsaid, so a
    plugin from before the option still accepts it."""
    return {} if reload == "auto" else {"reload": reload}


class HttpTransport(WeightTransport):
    """Inline base64 safetensors chunks."""

    name = "http"
    in_band = True  # the payload is in update_info: the engine's one-call swap can carry it
    carries_adapters = True

    def __init__(self, chunk_mb: int = 64, reload: str = "auto") -> None:
        self.chunk_bytes = chunk_mb * 1024 * 1024
        self.reload = reload

    @classmethod
    def from_config(cls, cfg, device: torch.device) -> HttpTransport:
        return cls(cfg.trainer.http_chunk_mb, reload=cfg.trainer.cpu_reload)

    async def init(self, admin: VLLMAdmin) -> None:
        await admin.init_engine(cpu_init_info(self.reload))

    def prepare(self, named: list[tuple[str, torch.Tensor]], version: int) -> Prepared:
        from safetensors.torch import save

        infos, total = [], 0
        for chunk in split_by_bytes([(n, t.cpu()) for n, t in named], self.chunk_bytes):
            raw = save(dict(chunk))
            total += len(raw)
            infos.append({"safetensors_b64": base64.b64encode(raw).decode("ascii")})
        return Prepared(version, infos, nbytes=total)

    async def send(self, admin: VLLMAdmin, prepared: Prepared) -> None:
        for info in prepared.update_infos:
            await admin.update(info)


class SharedPathTransport(WeightTransport):
    """A safetensors file per version in a folder shared with the servers."""

    name = "shared_path"
    in_band = True
    carries_adapters = True

    def __init__(self, folder: Path, keep: int = 2, reload: str = "auto") -> None:
        self.folder, self.keep, self.reload = Path(folder), keep, reload

    @classmethod
    def from_config(cls, cfg, device: torch.device) -> SharedPathTransport:
        folder = cfg.trainer.shared_weights_dir or Path(cfg.resolved_output_dir) / "shared_weights"
        return cls(folder, reload=cfg.trainer.cpu_reload)

    async def init(self, admin: VLLMAdmin) -> None:
        await admin.init_engine(cpu_init_info(self.reload))

    def prepare(self, named: list[tuple[str, torch.Tensor]], version: int) -> Prepared:
        from safetensors.torch import save_file

        target = self.folder / f"v{version}"
        tmp = self.folder / f".v{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_file({n: t.cpu() for n, t in named}, str(tmp / "model.safetensors"))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)  # atomic: a reader never sees half a file
        self._prune(version)
        size = (target / "model.safetensors").stat().st_size
        return Prepared(version, [{"path": str(target.resolve())}], uri=str(target.resolve()), nbytes=size)

    def _prune(self, version: int) -> None:
        for old in self.folder.glob("v*"):
            try:
                v = int(old.name[1:])
            except ValueError:
                continue
            if v <= version - self.keep:
                shutil.rmtree(old, ignore_errors=True)

    async def send(self, admin: VLLMAdmin, prepared: Prepared) -> None:
        for info in prepared.update_infos:
            await admin.update(info)

