"""`agrpo merge CHECKPOINT OUT [--base MODEL]`: a LoRA checkpoint merged into its base model.

The result is a plain HF model folder (weights, config, tokenizer) that transformers and vLLM load
like any other, for serving or evaluating the trained policy without peft.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import lora


def merge(checkpoint: str | Path, out: str | Path, base: str | None = None) -> Path:
    """Write the base model with `checkpoint`'s adapter merged in to `out`; returns `out`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = Path(checkpoint)
    if not lora.is_adapter_dir(ckpt):
        raise ValueError(f"{ckpt}: no {lora.ADAPTER_CONFIG} (not a LoRA checkpoint)")
    base = base or json.loads((ckpt / lora.ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{ckpt / lora.ADAPTER_CONFIG} names no base model: pass --base")
    model = AutoModelForCausalLM.from_pretrained(base, dtype="auto")
    merged = PeftModel.from_pretrained(model, str(ckpt)).merge_and_unload()
    merged.save_pretrained(str(out))
    has_tokenizer = (ckpt / "tokenizer_config.json").exists()
    AutoTokenizer.from_pretrained(str(ckpt) if has_tokenizer else base).save_pretrained(str(out))
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agrpo merge", description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="a checkpoint folder of a run with peft: set (output_dir/checkpoint-N)")
    p.add_argument("out", help="folder for the merged model")
    p.add_argument("--base", help="the base model (default: the one the checkpoint names)")
    a = p.parse_args(argv)
    try:
        print(f"merged model: {merge(a.checkpoint, a.out, a.base)}")
    except (OSError, ValueError) as exc:
        print(f"agrpo merge: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0
