"""Multi-turn rollouts: tools, environments and token-exact reconciliation."""
