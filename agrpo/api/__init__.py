"""TRL's Python API on top of `agrpo run`: `from agrpo import AsyncGRPOTrainer, AsyncGRPOConfig`."""

from .trainer import AsyncGRPOConfig, AsyncGRPOTrainer

__all__ = ["AsyncGRPOConfig", "AsyncGRPOTrainer"]
