"""The rollout service: generate with vLLM, score with the reward service, stream to the trainer."""
