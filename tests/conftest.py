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


def published_rows(records) -> list:
    """Validation rows as test parameters: a row that says why the model misses it
    (``outside``) is expected outside its tolerance, strictly, so that if it comes within
    its reason must go."""
    return [pytest.param(row, marks=pytest.mark.xfail(reason=row["outside"], strict=True), id=row["id"])
            if row["outside"] else pytest.param(row, id=row["id"]) for row in records]


def assert_within(row, regime: str | None = None) -> None:
    """The row's prediction is within its regime's tolerance, else say by how much."""
    metric = f" {row['metric']}" if isinstance(row.get("metric"), str) and row["metric"] else ""
    assert abs(row["error"]) <= row["tolerance"], (
        f"{row['id']} ({row['where']}): predicted {row['predicted']:.4g} vs measured {row['measured']:.4g}"
        f"{metric}: {row['error']:+.1%}, outside the {regime or row['regime']} tolerance of {row['tolerance']:.0%}")
