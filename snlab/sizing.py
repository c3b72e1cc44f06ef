"""A model's size from its shape: parameters, FLOPs per token, KV-cache bytes.

Thin compositions of the compute and memory walls for a :class:`~snlab.specs.Model`.
Any shape field can be overridden with an array (``params(model, hidden_size=[...])``)
to size a whole family of models in one call.
"""

from __future__ import annotations

import numpy as np

from .specs import Model
from .walls import compute as cw
from .walls import memory as mw


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
