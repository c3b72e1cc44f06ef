"""The memory wall's claims, C1-C3: exact arithmetic on a model's shape."""

from __future__ import annotations

from .verdict import CONDITIONAL, FAILS, HOLDS, Decision, Verdict, verdict_of


def c1(model="megatron-1t") -> Verdict:
    """C1: a dense 1T-parameter model needs about 2 TB for its BF16 weights."""
    from ..presets import model as load
    from ..walls import memory as mw
    m = load(model)
    weights = float(mw.weight_memory(params_per_device=m.params, weight_bytes=2, zero_stage=0, zero_shards=1))
    d = Decision("distance of the BF16 weights from 2 TB", abs(weights / 2e12 - 1), 0.05, above=False)
    return Verdict("C1", "A dense 1T-parameter model needs about 2 TB just for its BF16 weights.",
                   HOLDS if d.passes else FAILS, "",
                   {"parameters": m.params, "BF16 weights [TB]": weights / 1e12},
                   f"Two bytes per parameter: {m.name} has {m.params:.4g} parameters.", (d,))


def c2(model="megatron-1t") -> Verdict:
    """C2: Adam adds about 4 TB for its moment and variance at 1T parameters."""
    from ..presets import model as load
    from ..walls import memory as mw
    n = load(model).params
    states = {q: float(mw.optimizer_memory(params_per_device=n, optimizer_bytes=q, zero_stage=0, zero_shards=1))
              for q in (4, 8, 12)}
    d16 = Decision("distance of the 16-bit moments from 4 TB", abs(states[4] / 4e12 - 1), 0.05, above=False)
    d32 = Decision("distance of fp32 moments (standard Adam) from 4 TB", abs(states[8] / 4e12 - 1), 0.05,
                   above=False)
    return Verdict("C2", "Adam adds about 4 TB more for its moment and variance at that scale.",
                   verdict_of([d16, d32]),
                   "the two moments are kept in 16-bit; standard mixed-precision Adam keeps them in fp32 "
                   "(8 TB) plus an fp32 master copy of the weights: 12 TB of optimizer state",
                   {"moments in bf16 [TB]": states[4] / 1e12, "moments in fp32 [TB]": states[8] / 1e12,
                    "fp32 master + moments [TB]": states[12] / 1e12},
                   "Rajbhandari et al. 2019 (ZeRO) Sec. 3.1: K = 12 bytes per parameter of optimizer state.",
                   (d16, d32))


def c3(small="megatron-7.5b", big="megatron-1t", seq_len_small=2048, seq_len_big=2048) -> Verdict:
    """C3: from 10B to 1T, activations, optimizer state and gradient traffic grow
    'exponentially' and model scale 'cubically'."""
    from ..presets import model as load
    from ..sizing import activation_bytes_per_layer, forward_flops_per_token
    lo, hi = load(small), load(big)

    def per_sequence(m, s):
        return float(activation_bytes_per_layer(m, seq_len=s, recompute=1)) * m.layers

    ratios = {
        "parameters": hi.params / lo.params,
        "optimizer state": hi.params / lo.params,
        "gradient all-reduce bytes": hi.params / lo.params,
        "FLOPs per token": float(forward_flops_per_token(hi, seq_len_big) / forward_flops_per_token(lo, seq_len_small)),
        "activations per sequence": per_sequence(hi, seq_len_big) / per_sequence(lo, seq_len_small),
    }
    fastest = max(ratios.values()) / ratios["parameters"]
    d = Decision("fastest growth over the parameters' growth", fastest, 2.0, above=True)
    return Verdict("C3", "From 10B to 1T parameters, activations, optimizer state and gradient traffic grow "
                         "exponentially, and model scale cubically.",
                   CONDITIONAL if d.passes else FAILS, "the context grows with the model",
                   {f"{k} ratio": v for k, v in ratios.items()},
                   "At the same context every quantity grows at most in proportion to the parameters "
                   "(activations per sequence grow with L x h, slower still): growth is linear, not "
                   "exponential or cubic.", (d,))
