"""More of any capacity never makes a result worse, on every shipped system.

Along each capacity (the scale-up domain's size, every link's and memory's bandwidth,
every memory's capacity, the peak), a sweep of sorted values must give step times,
times to first token and times per output token that never rise, and a plan that fits
must keep fitting. The domain sizes include ones that split a parallel group unevenly
(6 devices for a group of 8), where a naive placement gets slower as the domain grows.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snlab
from snlab.hardware import hardware
from snlab.presets import names

from test_training_properties import plans

SYSTEMS = names("system")
REL = 1e-9
SETTINGS = dict(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
#: capacities, and the factors their sweeps apply to the system's own value
BANDWIDTHS = ("scale_up_bandwidth", "scale_out_bandwidth", "host_bandwidth", "hbm_bandwidth", "pool_bandwidth",
              "storage_bandwidth", "host_memory_bandwidth")
CAPACITIES = ("hbm_capacity", "host_capacity", "pool_capacity", "storage_capacity")
FACTORS = np.array([0.5, 0.75, 1.0, 1.3, 2.0, 3.0, 8.0])


@lru_cache(maxsize=None)
def _hw(system):
    return hardware(snlab.system(system))


def _values(system, field):
    base = float(getattr(_hw(system), field))
    if field == "scale_up_domain_size" and snlab.system(system).scale_up.topology.kind == "torus":
        return None                 # a torus's domain is the job's slice, which the plan sets (test_topology.py)
    if field == "scale_up_domain_size":
        # every size from 1 to well beyond the domain, the uneven ones included
        return np.unique(np.concatenate([np.arange(1.0, 17.0), np.round(base * FACTORS), [base]]))
    if base == 0:
        return None
    return base * FACTORS


def _never_worse(frame, times, fits="fits"):
    """Each time column never rises down the rows, and ``fits`` never goes from true to
    false, among rows that obey every rule."""
    ok = frame[frame["valid"]]
    for col in times:
        values = ok[col].to_numpy(dtype=float)
        assert np.all(values[1:] <= values[:-1] * (1 + REL) + 1e-300), (col, values)
    flags = ok[fits].to_numpy(dtype=bool)
    assert not np.any(flags[:-1] & ~flags[1:]), (fits, flags)


@settings(**SETTINGS)
@given(case=plans(), system=st.sampled_from(SYSTEMS),
       field=st.sampled_from(("scale_up_domain_size", "peak_flops") + BANDWIDTHS[:5] + CAPACITIES[:3]))
def test_more_of_any_capacity_never_slows_training_nor_stops_a_plan_fitting(case, system, field):
    model, _, plan = case
    values = _values(system, field)
    if values is None:
        return
    df = snlab.sweep(model, system, **plan, **{field: values})
    _never_worse(df, ("step_time_s",))
    if field != "peak_flops":                  # the same FLOPs in less time
        mfu = df[df["valid"]]["mfu"].to_numpy()
        assert np.all(mfu[1:] >= mfu[:-1] * (1 - REL))


@pytest.mark.parametrize("system", SYSTEMS)
def test_the_domain_sizes_that_split_a_group_never_slow_training(system):
    """The cases a scan once found slower as the domain grew: a ZeRO-3 group of 8 on
    domains of 6 and 8, and an expert group of 64 members 8 ranks apart on domains of
    256, 384 and 512 (384 holds 48 of them: an uneven split)."""
    if _values(system, "scale_up_domain_size") is None:
        return
    dense = snlab.sweep("gpt3-175b", system, tp=1, dp=8, zero=3, global_batch=64,
                        scale_up_domain_size=[4, 5, 6, 7, 8, 12, 16])
    _never_worse(dense, ("step_time_s",))
    moe = snlab.sweep("deepseek-v3", system, tp=8, pp=8, dp=64, ep=64, global_batch=1024,
                      scale_up_domain_size=[128, 256, 384, 448, 512, 1024])
    _never_worse(moe, ("step_time_s", "time_ep_s"))


SERVE_CASES = [
    ("llama3-8b", dict(tp=1, batch=8, prompt_len=2048, output_len=256)),
    ("llama3-70b", dict(tp=8, batch=16, prompt_len=8192, output_len=512)),
    ("llama3-70b", dict(tp=4, pp=2, batch=64, prompt_len=32_000, output_len=1000)),
    ("deepseek-v3", dict(dp=16, ep=16, batch=256, prompt_len=4096, output_len=256, weight_dtype="fp8")),
    ("deepseek-v3", dict(dp=32, ep=32, batch=1024, prompt_len=2048, output_len=256, weight_dtype="fp8",
                         microbatches=2)),
]


@settings(**SETTINGS)
@given(case=st.sampled_from(SERVE_CASES), system=st.sampled_from(SYSTEMS),
       field=st.sampled_from(("scale_up_domain_size", "peak_flops") + BANDWIDTHS + CAPACITIES))
def test_more_of_any_capacity_never_slows_serving_nor_stops_it_fitting(case, system, field):
    model, dep = case
    values = _values(system, field)
    if values is None:
        return
    df = snlab.serve_sweep(model, system, **dep, **{field: values})
    if not df["valid"].any():
        return
    _never_worse(df, ("ttft_s", "tpot_s"))


def test_no_time_is_negative_in_a_large_sweep():
    """Every time of every valid row of a mixed grid (overlap levels, offload, ZeRO,
    recomputation, long sequences) is zero or more: the exposed share of a class is its
    time less its share of what was hidden, which rounding could take below zero."""
    axes = dict(tp=[1, 2, 4, 8, 16, 32], pp=[1, 2, 4, 8], dp=[1, 2, 4, 8], micro_batch=[1, 4], global_batch=64,
                recompute=["none", "selective", "full"], zero=[0, 1, 2, 3],
                offload=["none", "optimizer", "activations", "both"],
                overlap=["none", "standard", "all", "dp=0.3,tp=0.7,pp=0.5,offload=0.9,zero=0.6"],
                flash_attention=[True, False], seq_len=[2048, 32768])
    rows = 0
    for system in ("gb200-nvl72", "cloudmatrix384", "pcie-ethernet-a100"):
        df = snlab.sweep("megatron-1t", system, **axes)
        valid = df[df["valid"]]
        rows += len(valid)
        for col in [c for c in df.columns if c.startswith(("time_", "exposed_", "wall_")) or c == "step_time_s"]:
            assert (valid[col] >= 0).all(), (system, col, valid[col].min())
    assert rows > 100_000
    serving = snlab.serve_sweep("llama3-70b", "cloudmatrix384", tp=[1, 2, 4, 8], pp=[1, 2], batch=[1, 8, 64, 512],
                                prompt_len=[1000, 100_000], output_len=[10, 1000], draft_tokens=[0, 2],
                                microbatches=[1, 2], kv_offload=["auto", "hbm"])
    valid = serving[serving["valid"]]
    for col in [c for c in serving.columns if c.endswith("_s") and not c.endswith(("_low", "_high"))]:
        assert (valid[col] >= 0).all(), (col, valid[col].min())
