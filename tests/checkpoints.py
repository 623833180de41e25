"""Tiny random Hugging Face checkpoints built in the tests (no hub, no network)."""

from __future__ import annotations

from pathlib import Path

import torch

TEXT = (
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
    "        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n"
    "Hybrid models mix state-space layers with attention. Ünïcödé text — ok: café, naïve, 数据.\n"
)
VOCAB = 320


def make_tokenizer(directory: Path) -> None:
    """A real byte-level BPE tokenizer trained on a few lines, saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - 8,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT] * 4, trainer)
    tok.save(str(directory / "tokenizer.json"))


def make_jamba(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Jamba with Mamba1 + attention (every 2nd layer) and a 4-expert top-2 MoE."""
    from transformers import JambaConfig, JambaForCausalLM

    torch.manual_seed(seed)
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=4,
        num_experts_per_tok=2,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=4,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    kwargs.update(overrides)
    model = JambaForCausalLM(JambaConfig(**kwargs))
    _randomize(model)
    model.save_pretrained(directory)
    make_tokenizer(directory)
    return directory


def make_llama(directory: Path, seed: int = 0, **overrides: object) -> Path:
    """Llama with grouped-query attention and RoPE."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    kwargs = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    kwargs.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**kwargs))
    _randomize(model)
    model.save_pretrained(directory)
    make_tokenizer(directory)
    return directory


def _randomize(model: torch.nn.Module) -> None:
    """Norm weights and Mamba D away from their all-ones init, so a wrong mapping shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith(".D"):
                p.add_(torch.randn_like(p) * 0.1)
