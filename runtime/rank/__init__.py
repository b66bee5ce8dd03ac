"""What every rank runs: the entry point, the hybrid worker and its sides, its process group."""
