"""The run folder on disk: its paths, checkpoints and metrics sinks."""
