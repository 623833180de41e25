"""Graph contract, manifest and inspection. Never imports torch."""
