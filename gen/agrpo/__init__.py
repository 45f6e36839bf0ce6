"""agrpo: `from agrpo import AsyncGRPOTrainer, AsyncGRPOConfig` (services/api); the protobuf
contract of the services is `agrpo.v1`, generated from protos/ by scripts/gen_protos.py."""

__all__ = ["AsyncGRPOConfig", "AsyncGRPOTrainer"]


def __getattr__(name):
    if name in __all__:
        from services import api

        return getattr(api, name)
    raise AttributeError(f"module 'agrpo' has no attribute {name!r}")
