"""A model's size from its shape: parameters, FLOPs per token, KV-cache bytes.

Thin compositions of the compute and memory walls for a :class:`~snlab.specs.Model`.
Any shape field can be overridden with an array (``params(model, hidden_size=[...])``)
to size a whole family of models in one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from .walls import compute as cw
from .walls import memory as mw

if TYPE_CHECKING:
    from .specs import Model


def _values(model: Model, overrides: dict) -> dict:
    values = model.symbol_values()
    values.update(overrides)
    return values


def _with_blocks(model: Model, values: dict) -> dict:
    attention = cw.attention_params_mla if model.mla else cw.attention_params_gqa
    values = dict(values)
    values["attention_params"] = attention.evaluate(values)
    values["mlp_params"] = cw.mlp_params.evaluate(values)
    values["moe_params"] = cw.moe_params.evaluate(values)
    values["moe_active_params"] = cw.moe_active_params.evaluate(values)
    return values


def params(model: Model, **overrides) -> np.ndarray | float:
    """Total parameters [1] (Narayanan 2021 Eq. 2, generalised)."""
    return cw.total_params.evaluate(_with_blocks(model, _values(model, overrides)))


def active_params(model: Model, **overrides) -> np.ndarray | float:
    """Parameters a token uses [1]; equals ``params`` for a dense model."""
    return cw.active_params.evaluate(_with_blocks(model, _values(model, overrides)))


def expert_params(model: Model, **overrides) -> np.ndarray | float:
    """Parameters of the routed experts [1] (sharded by expert parallelism)."""
    if model.moe is None:
        return 0.0
    values = _with_blocks(model, _values(model, overrides))
    routed = values["moe_params"] - cw.moe_params.evaluate({**values, "experts": 0})
    return (values["layers"] - values["dense_layers"]) * routed


def matmul_params(model: Model, **overrides) -> np.ndarray | float:
    """Weights of the layers' matrix multiplies a token uses [1], the 24 L h^2 / 2 of
    Narayanan 2021 Eq. 3 for GPT: active parameters without embeddings, biases, norms."""
    values = _values(model, overrides)
    values.update(bias=0, norm_params=0, vocab_size=0, learned_positions=0)
    return cw.active_params.evaluate(_with_blocks(model, values))


def attention_head_dim(model: Model) -> float:
    """Per-head dimension for the attention-score FLOPs: d_h, or (d_qk + d_v)/2 for MLA."""
    if model.mla:
        m = model.mla
        return (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / 2
    return model.head_dim


def forward_flops_per_token(model: Model, context_len, **overrides) -> np.ndarray | float:
    """Forward FLOPs per token [FLOP] attending to ``context_len`` tokens."""
    values = _values(model, overrides)
    values.update(matmul_params=matmul_params(model, **overrides), context_len=context_len,
                  head_dim=overrides.get("head_dim", attention_head_dim(model)))
    return cw.forward_flops_per_token.evaluate(values)


def kv_cache_bytes_per_token(model: Model, kv_bytes: float = 2.0, **overrides) -> np.ndarray | float:
    """KV-cache bytes per token of context per sequence [bytes]."""
    values = _values(model, overrides)
    values["kv_bytes"] = kv_bytes
    formula = mw.kv_cache_per_token_mla if model.mla else mw.kv_cache_per_token_gqa
    return formula.evaluate(values)


@dataclass(frozen=True)
class ModelSizes:
    """The per-layer sizes of a model that the step models need [counts].

    ``attention_head_dim`` is the head dimension the attention-score FLOPs use
    ((d_qk + d_v)/2 for MLA); ``activation_kv_heads`` and ``activation_head_dim`` size
    the K and V tensors a layer keeps (with latent attention every head has its own
    up-projected key and value); ``dense_matmul_params`` are the weights of an average
    layer's matrix multiplies outside the routed experts (attention, dense MLPs, shared
    experts, router); ``expert_params_one`` those of one routed expert;
    ``layer_params`` the non-expert parameters of all transformer layers (embeddings
    excluded); ``embedding_params`` the input embedding (and learned positions).
    """

    layers: float
    hidden_size: float
    heads: float
    kv_heads: float
    attention_head_dim: float
    activation_kv_heads: float
    activation_head_dim: float
    vocab_size: float
    mlp_matrices: float
    ffn_activation_width: float
    dense_matmul_params: float
    expert_params_one: float
    experts: float
    experts_per_token: float
    moe_layers: float
    matmul_params: float
    params: float
    expert_params: float
    layer_params: float
    embedding_params: float
    embedding_copies: float


@lru_cache(maxsize=256)
def model_sizes(model: "Model") -> ModelSizes:
    """The :class:`ModelSizes` of ``model``, from the compute wall's parameter formulas."""
    v = model.symbol_values()
    no_bias = dict(bias=0, norm_params=0)
    attn = (cw.attention_params_mla if model.mla else cw.attention_params_gqa).evaluate({**v, **no_bias})
    mlp = cw.mlp_params.evaluate({**v, **no_bias})
    moe, L, h = model.moe, model.layers, model.hidden_size
    dense_layers, n_mlp = v["dense_layers"], v["mlp_matrices"]
    moe_layers = L - dense_layers
    expert_one = n_mlp * h * moe.expert_ffn_hidden_size if moe else 0.0
    shared = moe.shared_experts * expert_one if moe else 0.0
    router = h * moe.experts if moe else 0.0
    total, experts_total = float(params(model)), float(expert_params(model))
    emb = model.vocab_size * h + (model.seq_len * h if model.learned_positions else 0)
    f_act = (dense_layers * model.ffn_hidden_size
             + moe_layers * ((moe.experts_per_token + moe.shared_experts) * moe.expert_ffn_hidden_size if moe else 0)) / L
    head_dim = float(attention_head_dim(model))
    return ModelSizes(
        layers=float(L), hidden_size=float(h), heads=float(model.heads), kv_heads=float(model.kv_heads),
        attention_head_dim=head_dim, activation_kv_heads=float(model.heads if model.mla else model.kv_heads),
        activation_head_dim=head_dim, vocab_size=float(model.vocab_size), mlp_matrices=float(n_mlp),
        ffn_activation_width=float(f_act),
        dense_matmul_params=float(attn + (dense_layers * mlp + moe_layers * (shared + router)) / L),
        expert_params_one=float(expert_one), experts=float(moe.experts if moe else 0),
        experts_per_token=float(moe.experts_per_token if moe else 0), moe_layers=float(moe_layers),
        matmul_params=float(matmul_params(model)), params=total, expert_params=experts_total,
        layer_params=total - experts_total - emb - (model.vocab_size * h if not model.tied_embeddings else 0),
        embedding_params=float(emb), embedding_copies=float(1 if model.tied_embeddings else 2),
    )
