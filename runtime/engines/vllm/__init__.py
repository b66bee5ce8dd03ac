"""vLLM behind the rollout side: the engine, its worker extension and its stat logger."""
