"""A sample's data from prompt to batch: typed samples, datasets, prompts, the text codec."""
