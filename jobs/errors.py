class UserError(Exception):
    """A mistake the user can fix; the CLI prints ``str()`` as one line and exits 2."""
