"""Workloads: what each kind is made of (kinds.py), agent loops, rewards, and the sandbox
model-written code runs in."""
