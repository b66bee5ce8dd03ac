"""Simulated engines for benchmarks and the cluster simulator: the real control code runs
against them with a simulated clock."""
