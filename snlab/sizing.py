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
from . import kernel as _kernel

_kernel.loaded(__name__)

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
    ``query_width``, ``attention_output_width`` and ``latent_width`` are the widths of the
    attention tensors a token keeps for the backward pass; ``routed_copies`` and
    ``router_width`` the dispatched copies and router logits of an average layer.
    The ``*_width`` fields are what selective recomputation and FP8 storage act on, per
    token of an average layer: the norms' outputs (and latent attention's normalised
    latents), the queries, keys and values after latent attention's up-projection, the
    tensors inside the dense MLP, the routed experts' activation output and all their
    hidden tensors, the shared experts' hidden tensors, and the inputs of the dense and
    shared down-projections; ``mlp_params_avg``, ``shared_params_avg`` and
    ``mla_up_params`` the matrix weights an average layer recomputes with them.
    ``mtp_modules`` multi-token-prediction modules (each one more transformer layer, a
    2h x h projection and the output head, on the last stage: ``mtp_matmul_params`` are
    their matrix weights); ``expert_groups`` / ``groups_per_token`` the group-limited
    routing (0: none); ``dropout`` 1 if the model trains with dropout (its masks are kept).
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
    query_width: float = 0.0
    attention_output_width: float = 0.0
    latent_width: float = 0.0
    routed_copies: float = 0.0
    router_width: float = 0.0
    mtp_modules: float = 0.0
    mtp_matmul_params: float = 0.0
    expert_groups: float = 0.0
    groups_per_token: float = 0.0
    dropout: float = 0.0
    norm_output_width: float = 0.0
    mla_up_width: float = 0.0
    dense_mlp_width: float = 0.0
    routed_act_width: float = 0.0
    routed_mlp_width: float = 0.0
    shared_mlp_width: float = 0.0
    dense_down_width: float = 0.0
    shared_down_width: float = 0.0
    mlp_params_avg: float = 0.0
    shared_params_avg: float = 0.0
    mla_up_params: float = 0.0


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
    if model.mla:
        m = model.mla
        q_width, o_width = model.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), model.heads * m.v_head_dim
        latent = 2 * m.q_lora_rank + 2 * m.kv_lora_rank + m.qk_rope_head_dim
    else:
        q_width = o_width = model.heads * model.head_dim
        latent = 0
    moe_share = moe_layers / L
    dense_share = dense_layers / L
    k, n_sh, f_e = (moe.experts_per_token, moe.shared_experts, moe.expert_ffn_hidden_size) if moe else (0, 0, 0)
    if model.mla:
        m = model.mla
        norm_latents = (m.q_lora_rank or 0) + m.kv_lora_rank
        up_width = q_width + 2 * model.heads * head_dim
        up_params = (model.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) * (m.q_lora_rank or 0)
                     + model.heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank)
    else:
        norm_latents = up_width = up_params = 0
    # one MTP module: a transformer layer like the last one (a MoE layer when the model has
    # experts), the 2h x h projection of [embedding; hidden], and the shared output head
    mtp_layer = attn + (shared + router + moe.experts_per_token * expert_one if moe else mlp)
    mtp = model.mtp_modules * (mtp_layer + 2 * h * h + model.vocab_size * h)
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
        query_width=float(q_width), attention_output_width=float(o_width), latent_width=float(latent),
        routed_copies=float(moe.experts_per_token * moe_share if moe else 0.0),
        router_width=float(moe.experts * moe_share if moe else 0.0),
        mtp_modules=float(model.mtp_modules), mtp_matmul_params=float(mtp),
        expert_groups=float(moe.expert_groups if moe else 0), groups_per_token=float(moe.groups_per_token if moe else 0),
        dropout=float(model.dropout),
        norm_output_width=float(2 * h + norm_latents), mla_up_width=float(up_width),
        dense_mlp_width=float(dense_share * n_mlp * model.ffn_hidden_size),
        routed_act_width=float(moe_share * k * f_e), routed_mlp_width=float(moe_share * n_mlp * k * f_e),
        shared_mlp_width=float(moe_share * n_mlp * n_sh * f_e),
        dense_down_width=float(dense_share * model.ffn_hidden_size), shared_down_width=float(moe_share * n_sh * f_e),
        mlp_params_avg=float(dense_share * mlp), shared_params_avg=float(moe_share * shared),
        mla_up_params=float(up_params),
    )


def activation_widths(sizes: ModelSizes) -> dict:
    """The shape inputs of :data:`snlab.walls.memory.activation_memory_per_layer` for an
    average layer of a model: the widths of the tensors its tokens keep."""
    return dict(hidden_size=sizes.hidden_size, heads=sizes.heads, kv_heads=sizes.activation_kv_heads,
                head_dim=sizes.activation_head_dim, ffn_activation_width=sizes.ffn_activation_width,
                mlp_matrices=sizes.mlp_matrices, query_width=sizes.query_width,
                attention_output_width=sizes.attention_output_width, latent_width=sizes.latent_width,
                routed_copies=sizes.routed_copies, router_width=sizes.router_width, dropout=sizes.dropout,
                logit_bytes=4.0)


def activation_bytes_per_layer(model: Model, *, seq_len=None, micro_batch=1, tp=1, sequence_parallel=0,
                               recompute=0, activation_bytes=2.0):
    """Activation bytes an average layer of ``model`` keeps for one micro-batch [bytes]
    (:data:`snlab.walls.memory.activation_memory_per_layer` at the model's widths)."""
    return mw.activation_memory_per_layer.evaluate(dict(
        activation_widths(model_sizes(model)), seq_len=model.seq_len if seq_len is None else seq_len,
        micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel, recompute=recompute,
        activation_bytes=activation_bytes))
