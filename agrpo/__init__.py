"""agrpo: asynchronous GRPO as three gRPC services, with TRL's Python API.

    from agrpo import AsyncGRPOTrainer, AsyncGRPOConfig
    from agrpo.rewards import accuracy_reward

What lives where once installed (the only top-level name agrpo puts in site-packages):
- `agrpo.api`: AsyncGRPOTrainer and AsyncGRPOConfig, as in TRL;
- `agrpo.rewards`: the built-in reward functions under TRL's names;
- `agrpo.cli`, `agrpo.launcher`, `agrpo.demo`: the `agrpo` command, `agrpo run`, `agrpo demo`;
- `agrpo.services`: the reward, rollout and trainer services (the repository's services/);
- `agrpo.v1`: the protobuf contract, generated from protos/ by scripts/gen_protos.py.
Heavy modules load only when a name that needs them is used.
"""

__version__ = "0.1.0"
__all__ = ["AsyncGRPOConfig", "AsyncGRPOTrainer", "__version__"]


def __getattr__(name):
    if name in ("AsyncGRPOConfig", "AsyncGRPOTrainer"):
        from agrpo import api

        return getattr(api, name)
    raise AttributeError(f"module 'agrpo' has no attribute {name!r}")
