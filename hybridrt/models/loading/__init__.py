"""From a Hugging Face checkpoint to the reference model: the architecture registry
(model_type -> translator), the translators' shared helpers, reading safetensors one tensor at a
time, and loading a whole model. Weights come from safetensors only; nothing is unpickled."""
