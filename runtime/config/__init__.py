"""The typed configuration of a run: the recipe tree, recipe files, and the rank layout."""
