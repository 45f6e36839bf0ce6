"""The reward service: scores completions with reward functions over gRPC (RewardService)."""
