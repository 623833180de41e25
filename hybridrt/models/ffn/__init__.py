"""Feed-forward kinds beyond layers.py's MLP and MoE: Granite's shared expert, LFM2-MoE's
sigmoid routing, Qwen3-Next's gated shared expert, Nemotron-H's squared-ReLU MLP and MoE."""
