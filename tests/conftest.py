"""Shared helpers for the tests."""

from __future__ import annotations

import pytest

from snlab.specs import Model


def gpt(layers: int, hidden: int, heads: int, seq_len: int = 2048, vocab: int = 51200) -> Model:
    """A GPT-style model as in Narayanan et al. 2021 (f = 4h, biases, LayerNorm, tied
    embeddings, learned positions, dropout)."""
    return Model(name=f"gpt-{layers}x{hidden}", description="test GPT", layers=layers,
                 hidden_size=hidden, heads=heads, kv_heads=heads, head_dim=hidden // heads,
                 ffn_hidden_size=4 * hidden, vocab_size=vocab, seq_len=seq_len,
                 gated_mlp=False, biases=True, norm="layernorm", tied_embeddings=True,
                 learned_positions=True, dropout=True)


@pytest.fixture
def gpt_factory():
    return gpt
