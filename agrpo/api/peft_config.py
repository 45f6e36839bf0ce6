"""TRL's `peft_config=LoraConfig(...)` as the config's `peft:` section.

peft's LoraConfig carries many fields; the ones agrpo reads are PeftSection's (same names). Any
other field set away from peft's default would be silently ignored, so it is an error instead.
"""

from __future__ import annotations

from typing import Any

from agrpo.services.common.config.sections import PeftSection

_BOOKKEEPING = {"peft_type", "task_type", "peft_version", "base_model_name_or_path", "revision", "inference_mode",
                "auto_mapping"}
"""LoraConfig fields that describe where an adapter came from, not how it trains."""


def peft_section(peft_config: Any) -> dict[str, Any]:
    """The `peft:` keys of a peft LoraConfig (or a dict of its fields)."""
    if isinstance(peft_config, dict):
        given, defaults = dict(peft_config), {}
    else:
        kind = str(getattr(peft_config, "peft_type", "LORA")).rsplit(".", 1)[-1]
        if kind != "LORA" or not hasattr(peft_config, "to_dict"):
            raise TypeError(f"peft_config: only LoRA is supported (got {type(peft_config).__name__})")
        given, defaults = peft_config.to_dict(), type(peft_config)().to_dict()
    known = set(PeftSection.model_fields)
    unread = sorted(k for k, v in given.items()
                    if k not in known and k not in _BOOKKEEPING and (k not in defaults or v != defaults[k]))
    if unread:
        raise TypeError(f"peft_config: {', '.join(unread)} not supported (supported: {', '.join(sorted(known))})")
    out = {k: v for k, v in given.items() if k in known}
    if isinstance(out.get("target_modules"), (set, frozenset)):
        out["target_modules"] = sorted(out["target_modules"])
    if out.get("task_type") is not None:
        out["task_type"] = str(out["task_type"]).rsplit(".", 1)[-1]
    return out
