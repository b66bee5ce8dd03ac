"""The engines behind the two roles: vLLM and synthetic rollout, the torch trainer."""
