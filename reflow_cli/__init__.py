"""The ``reflow`` command line (Typer): thin commands over :mod:`jobs`."""
