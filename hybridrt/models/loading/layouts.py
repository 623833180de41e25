"""Checkpoint layouts that several families share: `Family.renames` tables ((regex,
replacement) pairs, applied in order) and `Family.ignore` patterns. Torch-free."""

from __future__ import annotations

# The rotary embedding's cached inverse frequencies: recomputed from the config.
ROTARY_CACHE = (r"rotary_emb\.inv_freq$",)

# Llama's decoder layer norms: `input_layernorm` before the mixer, `post_attention_layernorm`
# before the feed-forward (Granite, Qwen3-Next and Qwen3.5 name them so too).
LLAMA_NORMS = (
    (r"\.input_layernorm\.", ".input_norm."),
    (r"\.post_attention_layernorm\.", ".ffn_norm."),
)
LLAMA_RENAMES = ((r"\.self_attn\.", ".mixer."), (r"\.mlp\.", ".ffn.")) + LLAMA_NORMS

# Jamba's layout, which Bamba and Falcon-H1 keep: `final_layernorm`, a `feed_forward` after a
# `pre_ff_layernorm` (the mixer's rename is each family's own).
JAMBA_LAYOUT = (
    (r"^model\.final_layernorm\.", "model.norm."),
    (r"\.feed_forward\.", ".ffn."),
    (r"\.input_layernorm\.", ".input_norm."),
    (r"\.pre_ff_layernorm\.", ".ffn_norm."),
)
# The mixer as Jamba and Bamba name it: `mamba` or `self_attn`.
JAMBA_MIXER = ((r"\.(mamba|self_attn)\.", ".mixer."),)

MAMBA_RENAMES = (
    (r"^backbone\.embeddings\.", "model.embed_tokens."),
    (r"^backbone\.norm_f\.", "model.norm."),
    (r"^backbone\.layers\.(\d+)\.norm\.", r"model.layers.\1.input_norm."),
    (r"^backbone\.", "model."),
)

QWEN_GDN_RENAMES = (
    (r"\.(linear_attn|self_attn)\.", ".mixer."),
    *LLAMA_NORMS,
    (r"\.mlp\.gate\.weight$", ".ffn.router.weight"),
    (r"\.mlp\.", ".ffn."),
)
QWEN_GDN_IGNORE = ROTARY_CACHE + (r"^mtp\.",)

# A multimodal Qwen3.5 checkpoint: the language model under `model.language_model.`, the vision
# tower under `model.visual.` (not needed for text).
QWEN_MULTIMODAL_RENAMES = ((r"^model\.language_model\.", "model."),) + QWEN_GDN_RENAMES
QWEN_MULTIMODAL_IGNORE = QWEN_GDN_IGNORE + (r"^model\.visual\.",)

LFM2_RENAMES = (
    (r"^model\.embedding_norm\.", "model.norm."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.self_attn\.q_layernorm\.", ".self_attn.q_norm."),
    (r"\.self_attn\.k_layernorm\.", ".self_attn.k_norm."),
    (r"\.self_attn\.", ".mixer."),
    (r"^model\.layers\.(\d+)\.conv\.", r"model.layers.\1.mixer."),
    (r"\.operator_norm\.", ".input_norm."),
    (r"\.feed_forward\.w1\.", ".ffn.gate_proj."),
    (r"\.feed_forward\.w3\.", ".ffn.up_proj."),
    (r"\.feed_forward\.w2\.", ".ffn.down_proj."),
)
