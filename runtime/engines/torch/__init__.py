"""The torch trainer and its loss."""
