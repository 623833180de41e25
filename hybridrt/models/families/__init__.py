"""One module per Hugging Face family; each registers itself with `registry.register` when
imported. `registry.discover()` imports them all: adding a module here is the whole change."""
