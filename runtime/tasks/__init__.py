"""Workloads: how prompts are made and how responses are scored."""
