"""Workloads: agent loops, rewards, and the sandbox model-written code runs in."""
