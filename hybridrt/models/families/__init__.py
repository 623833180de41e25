"""One module per Hugging Face family; each registers itself with `registry.register` when
imported, and importing this package registers them all (checkpoint.py does)."""

from . import bamba, falcon_mamba, granitemoehybrid, jamba, lfm2, llama, mamba, mamba2

__all__ = ["bamba", "falcon_mamba", "granitemoehybrid", "jamba", "lfm2", "llama", "mamba", "mamba2"]
