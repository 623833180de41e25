"""One module per Hugging Face family; each registers itself with `registry.register`."""
