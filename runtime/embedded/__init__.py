"""The embedded default: tiny models built locally and the arithmetic task they learn."""
