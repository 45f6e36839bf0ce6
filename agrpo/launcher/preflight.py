"""Everything `agrpo run` checks before it starts a process: one line per mistake."""

from __future__ import annotations

from services.common.preflight import check_dataset, check_model, check_service_ports, check_vllm_urls


def check_job(cfg) -> None:
    """Ports of all three services, the model, the data, the vLLM URLs and the reward names."""
    for name in ("trainer", "rollout", "reward"):
        check_service_ports(cfg, name)
    check_model(cfg)
    check_dataset(cfg)
    check_vllm_urls(cfg)
    from services.reward.registry import check_names

    check_names(cfg)
