"""The mixers of the layer kinds (kinds.py names each by module): Mamba1, Mamba2, LFM2's short
conv, Gated DeltaNet, Falcon-H1's parallel attention + Mamba2, Zamba2's shared block, and the
post-norm attention of OLMo. Attention itself, the MLP and the MoE are layers.py's."""
