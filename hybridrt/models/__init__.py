"""PyTorch reference models with explicit state (needs the `export` extra).

decoder.py is the hybrid decoder (a stack of mixers chosen by `layer_types`); layers.py holds
attention, the MLP and the MoE; mixers/ the other layer kinds, ffn/ the other feed-forwards,
recurrences/ the scans they run, ops/ the fused-op seams export turns into onnxruntime
operators, loading/ the checkpoints and the architecture registry, families/ one translator per
model_type. context.py and state.py are what every mixer receives and keeps.
"""
