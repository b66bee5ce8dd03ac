"""Reward functions by workload: math answers (math-verify), code execution (code/)."""
