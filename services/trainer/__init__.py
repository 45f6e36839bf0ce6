"""The trainer service: GRPO learner that syncs weights into vLLM and publishes policy versions."""
