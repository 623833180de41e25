"""PyTorch reference models with explicit state (needs the `export` extra)."""
