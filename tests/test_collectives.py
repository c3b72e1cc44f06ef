"""Collective times and NCCL bus bandwidths against published nccl-tests runs.

``snlab.collective_time`` and ``snlab collective`` evaluate the same two-level formulas the
planners use. Bus bandwidth follows nccl-tests' definition (doc/PERFORMANCE.md): for an
all-reduce, algorithm bandwidth S / t times 2 (n - 1) / n; for reduce-scatter and
all-gather, times (n - 1) / n.

Measured points (every source is a key of snlab/presets/data/sources.toml):

* nccl-issue-812: NVIDIA states 192 GB/s all-reduce bus bandwidth on DGX A100 with eight
  200 Gb/s HDR NICs per node (large messages).
* nccl-tests-309: all_reduce_perf on 4 nodes of 8 H100 with eight 400 Gb/s NICs each
  (32 GPUs): 358.1, 363.5, 364.9 and 365.8 GB/s at 1, 4, 8 and 16 GiB; 34.75 us for 8 bytes.
* nccl-tests-322: the same test on 128 nodes (1,024 H100): 338.2, 364.6 and 367.3 GB/s at
  4, 8 and 16 GiB.

The model is checked where it is meant to hold: large messages (bandwidth-bound) and the
smallest ones (latency-bound). Between about 1 MB and 256 MB NCCL switches between its LL,
LL128 and Simple protocols, whose bandwidth caps the model leaves out; there it is
optimistic, by up to 3x at 8 MB (tested below, so that the statement stays true).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import snlab
from snlab.cli import main
from snlab.errors import SnlabError
from snlab.network import COLLECTIVES, bus_bandwidth
from snlab.presets import bibliography

GIB = 2**30

MEASURED = [  # (source, system, devices, message bytes, measured bus bandwidth [GB/s])
    ("nccl-issue-812", "dgx-a100", 256, 8e9, 192.0),
    ("nccl-tests-309", "dgx-h100", 32, 1 * GIB, 358.14),
    ("nccl-tests-309", "dgx-h100", 32, 4 * GIB, 363.54),
    ("nccl-tests-309", "dgx-h100", 32, 8 * GIB, 364.93),
    ("nccl-tests-309", "dgx-h100", 32, 16 * GIB, 365.84),
    ("nccl-tests-322", "dgx-h100", 1024, 4 * GIB, 338.16),
    ("nccl-tests-322", "dgx-h100", 1024, 8 * GIB, 364.57),
    ("nccl-tests-322", "dgx-h100", 1024, 16 * GIB, 367.29),
]


def busbw(system, op, size, devices):
    return bus_bandwidth(op, size, devices, snlab.collective_time(system, op, size, devices))


def test_the_sources_are_in_the_bibliography():
    assert {source for source, *_ in MEASURED} <= set(bibliography())


@pytest.mark.parametrize("source, system, devices, size, measured", MEASURED,
                         ids=[f"{m[1]}-{m[2]}gpu-{m[3]:.3g}B" for m in MEASURED])
def test_large_all_reduce_bus_bandwidth_within_20_percent(source, system, devices, size, measured):
    assert busbw(system, "all-reduce", size, devices) / 1e9 == pytest.approx(measured, rel=0.20)


def test_the_issue_benchmark_8_gb_over_256_gpus():
    """8 GB over 256 GPUs: about 190 GB/s on DGX A100 and 370 GB/s on DGX H100."""
    assert busbw("dgx-a100", "all-reduce", 8e9, 256) / 1e9 == pytest.approx(190, rel=0.20)
    assert busbw("dgx-h100", "all-reduce", 8e9, 256) / 1e9 == pytest.approx(370, rel=0.20)


def test_the_smallest_all_reduce_is_latency():
    """8 bytes over 32 H100: 34.75 us measured (nccl-tests-309); the tree's fill plus the
    per-call base latency, within a third."""
    assert snlab.collective_time("dgx-h100", "all-reduce", 8, 32) == pytest.approx(34.75e-6, rel=0.35)


def test_mid_size_messages_are_optimistic():
    """8 MB over 32 H100 took 217 us (nccl-tests-309): the model, without NCCL's protocol
    caps, says under half of that."""
    t = snlab.collective_time("dgx-h100", "all-reduce", 8 * 2**20, 32)
    assert t < 0.5 * 217.3e-6


def test_the_ring_latency_grows_with_the_ring():
    """A reduce-scatter's fill pays every step of NCCL's ring: at a fixed small message it
    takes longer on more nodes; an all-reduce can take the tree and grows far slower."""
    small = 1e3
    rs = [snlab.collective_time("dgx-h100", "reduce-scatter", small, n) for n in (16, 64, 256, 1024)]
    ar = [snlab.collective_time("dgx-h100", "all-reduce", small, n) for n in (16, 64, 256, 1024)]
    assert all(b > a for a, b in zip(rs, rs[1:]))
    assert rs[-1] > 50 * rs[0] / 16 and ar[-1] < rs[-1]


@settings(max_examples=60, deadline=None)
@given(system=st.sampled_from(["dgx-a100", "dgx-h100", "gb200-nvl72", "cloudmatrix384", "pcie-ethernet-a100"]),
       op=st.sampled_from(list(COLLECTIVES)), size=st.floats(1.0, 1e11), devices=st.integers(2, 4096))
def test_bus_bandwidth_never_beats_the_wires(system, op, size, devices):
    """No collective moves data faster than the links it uses: the ring sends (n_1 - 1)/n_1
    of the buffer over each scale-up link and (n_2 - 1)/n_2 of each device's 1/n_1 share
    through its NIC, so NCCL's bus bandwidth is at most (n - 1)/n times the smaller of
    n_1/(n_1 - 1) line rates inside and n_1 n_2/(n_2 - 1) NIC line rates across;
    times are finite and positive."""
    s = snlab.system(system)
    t = snlab.collective_time(system, op, size, devices)
    assert np.isfinite(t) and t > 0
    if op == "all-to-all":
        return
    n1 = min(devices, s.scale_up.domain_size)
    n2 = -(-devices // n1)
    limits = []
    if n1 > 1:
        limits.append(s.scale_up.bandwidth * n1 / (n1 - 1))
    if n2 > 1:
        limits.append(s.scale_out.bandwidth * n1 * n2 / (n2 - 1))
    ceiling = (devices - 1) / devices * min(limits)
    assert busbw(system, op, size, devices) <= ceiling * (1 + 1e-9)


def test_the_api_checks_its_inputs():
    with pytest.raises(SnlabError, match="op"):
        snlab.collective_time("dgx-h100", "broadcast", 1e6, 8)
    with pytest.raises(SnlabError, match="devices"):
        snlab.collective_time("dgx-h100", "all-reduce", 1e6, 1)
    with pytest.raises(SnlabError, match="message_bytes"):
        snlab.collective_time("dgx-h100", "all-reduce", -1.0, 8)
    with pytest.raises(SnlabError, match="message_bytes"):
        snlab.collective_time("dgx-h100", "all-reduce", float("nan"), 8)
    with pytest.raises(SnlabError):
        snlab.collective_time("no-such-system", "all-reduce", 1e6, 8)


def test_the_command_prints_time_and_bus_bandwidth(capsys):
    assert main(["collective", "--system", "dgx-a100", "--op", "all-reduce", "--bytes", "8e9",
                 "--devices", "256", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["time_s"] == pytest.approx(snlab.collective_time("dgx-a100", "all-reduce", 8e9, 256))
    assert out["bus_bandwidth_bytes_per_s"] / 1e9 == pytest.approx(190, rel=0.20)
    assert main(["collective", "--system", "dgx-h100", "--op", "all-gather", "--bytes", "1e9",
                 "--devices", "64"]) == 0
    assert "bus bandwidth" in capsys.readouterr().out


@pytest.mark.parametrize("args, field", [
    (["--op", "all-reduce", "--bytes", "-5", "--devices", "8"], "bytes"),
    (["--op", "all-reduce", "--bytes", "1e9", "--devices", "1"], "devices"),
    (["--op", "all-reduce", "--bytes", "1e9", "--devices", "eight"], "devices"),
    (["--op", "all-reduce", "--bytes", "nan", "--devices", "8"], "bytes"),
])
def test_the_command_names_the_bad_field(capsys, args, field):
    assert main(["collective", "--system", "dgx-h100", *args]) != 0
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err and err.count("\n") == 1
