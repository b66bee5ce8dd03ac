"""The embedded default model: a tiny Qwen3 built and saved as an ordinary HF folder."""
