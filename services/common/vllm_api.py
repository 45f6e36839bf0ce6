"""What a service reads from a vLLM server it talks to (no launching here: agrpo/launcher/vllm_process.py)."""

from __future__ import annotations

import re


def parse_vllm_version(text: str) -> tuple[int, int, int]:
    """'0.33.0', '0.28.1.dev12+g..', 'v0.30' -> (major, minor, patch): the one reading of a
    vLLM version string (rollout's minimum-version check, the trainer's protocol choices)."""
    nums = [int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3]]
    while len(nums) < 3:
        nums.append(0)
    return tuple(nums)  # type: ignore[return-value]


TRAINER_ENGINE = "agrpo-trainer"
"""The `engine` a server's /version names when the trainer serves generation itself
(trainer.weight_transport local): rollout accepts it in place of a vLLM version."""
