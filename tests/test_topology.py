"""Beyond one switch: topology as data, where a group sits on a torus or a mesh, the
collectives over them derived by hand, the published collective benchmarks, and every new
system planning a training and a serving job.

Hand derivations use the axis formulas' own statement (snlab.walls.communication): a group
spanning axes x, y, z of k members each cuts the buffer into one chunk per used axis and
reduces each chunk along every axis in turn, so each axis carries its chunk at full size
plus the other chunks already reduced by the axes they passed; the busiest axis sets the
pace and every axis adds its steps' latency.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from pytest import approx

import snlab
from snlab import network as net
from snlab import topology as topo
from snlab.cli import main
from snlab.errors import SnlabError
from snlab.hardware import hardware
from snlab.presets import bibliography
from snlab.specs import Axis, Topology
from hypothesis import given, settings
from hypothesis import strategies as st
from snlab.validation.collectives import TOLERANCE, collective_table

GIB = 2**30
NEW_SYSTEMS = ["gb300-nvl72", "mi300x-platform", "mi355x-platform", "tpu-v5p-pod", "tpu7x-pod", "trn2-ultraserver",
               "atlas-950-superpod", "cloudmatrix384-cluster"]
V5E = str(Path(snlab.__file__).parent / "validation" / "topology_systems" / "tpu-v5e-pod.toml")


def busbw(system, op, size, devices, **kw):
    return snlab.collective(system, op, size, devices, **kw).bus_bandwidth


# --- the full mesh: RCCL on 8 MI300X ---------------------------------------------------

def test_the_mi300x_all_reduce_of_1e9_bytes_is_within_20_percent_of_rccl():
    """`snlab collective --system mi300x-platform --op all-reduce --bytes 1e9 --devices 8`:
    the ROCm blog's rccl-tests log gives 314.72 GB/s bus bandwidth at 1 GiB (Azure: 313.92);
    the JSON names the measurement the link efficiency comes from."""
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["collective", "--system", "mi300x-platform", "--op", "all-reduce", "--bytes", "1e9",
                     "--devices", "8", "--json"]) == 0
    out = json.loads(buf.getvalue())
    assert out["bus_bandwidth_bytes_per_s"] / 1e9 == approx(314.72, rel=0.20)
    assert out["efficiency_source"].startswith("rocm-rccl-xgmi-blog") and "rocm-rccl-xgmi-blog" in bibliography()
    assert "full mesh" in out["algorithm"] and out["topology"] == "full-mesh 8 (mesh)"


def test_the_mesh_ring_by_hand():
    """8 MI300X: seven link-disjoint rings, one per link, so the ring sends 2 (n-1)/n S over
    n - 1 links of 64 GB/s at the TransferBench fraction 0.727; the fill pays 2 (n - 1) steps
    of 0.6 us and one call of 8.2 us."""
    S = 1e9
    t = snlab.collective_time("mi300x-platform", "all-reduce", S, 8)
    assert t == approx(8.2e-6 + 14 * 0.6e-6 + 2 * 7 / 8 * S / (0.727 * 7 * 64e9), rel=1e-9)
    # a group of 4 has only its 3 mutual links: 3/7 of the fabric
    t4 = snlab.collective_time("mi300x-platform", "all-reduce", S, 4)
    assert t4 == approx(8.2e-6 + 6 * 0.6e-6 + 2 * 3 / 4 * S / (0.727 * 3 * 64e9), rel=1e-9)
    # a pair gets one link of seven
    assert busbw("mi300x-platform", "all-reduce", 1e12, 2) / 1e9 == approx(0.727 * 64, rel=1e-3)


def test_the_mesh_one_shot_by_hand():
    """The one-shot all-reduce reads each of the n - 1 peers' whole buffer over its own link:
    one step, S over one link's rate, after the engines' 5.3 us fixed cost."""
    S = 64e3
    c = snlab.collective("mi300x-platform", "all-reduce", S, 8, algorithm="one-shot")
    assert c.time_s == approx(5.3e-6 + 0.6e-6 + S / (0.727 * 64e9), rel=1e-9)
    assert c.algorithm.startswith("one-shot") and "own link" in c.algorithm
    ring = snlab.collective_time("mi300x-platform", "all-reduce", S, 8)
    assert c.time_s < ring                              # small messages: one step beats fourteen
    assert snlab.collective_time("mi300x-platform", "all-reduce", 1e9, 8, algorithm="one-shot") > \
        3 * snlab.collective_time("mi300x-platform", "all-reduce", 1e9, 8)    # large: (n - 1) S per device


def test_the_mesh_all_to_all_and_two_platforms_by_hand():
    """All-to-all: each of the 7 peers gets S/8 over its own link, in one step per peer.
    Two platforms: NCCL's ring through both, the slower level's share at its pace."""
    S = 1e9
    a2a = snlab.collective_time("mi300x-platform", "all-to-all", S, 8)
    assert a2a == approx(8.2e-6 + 7 * 0.6e-6 + 7 / 8 * S / (0.727 * 7 * 64e9), rel=1e-9)
    c = snlab.collective("mi300x-platform", "all-reduce", S, 16)
    inner = 7 / 8 * S / (0.727 * 7 * 64e9)
    outer = 1 / 2 * (S / 8) / (0.91 * 50e9)
    assert c.time_s == approx(8.2e-6 + 2 * min(2 * 7 * 0.6e-6 + 2.7e-6, 7 * 0.6e-6 + 2.7e-6) + 2 * max(inner, outer),
                              rel=1e-9)
    assert c.placement == "8 per scale-up domain x 2 domains" and "double binary tree" in c.algorithm


# --- the torus ---------------------------------------------------------------------------

def test_a_3d_slice_gets_three_times_the_bus_bandwidth_of_one_ring_of_the_same_chips():
    """A 4x4x4 torus slice against one ring of the same 64 chips and links.

    By hand: on the slice each of the three axes carries its own third of the buffer plus the
    other two thirds, already reduced 4-fold and 16-fold by the axes they passed first:
    (S/3) (3/4) (1 + 1/4 + 1/16) = 21 S / 64 bytes over 2 paths (wrap-around) per direction,
    21 S / (128 b). One ring of 64 with wrap-around: (63/64) S over 2 paths, 63 S / (128 b).
    The ratio of their bandwidth terms is 63 / 21 = 3, the number of axes: that is the factor
    the formula states. The latency differs too: 3 axes x 3 steps against 63 steps."""
    S, b, eta, hop, call = 1e14, 100e9, 0.9, 1e-6, 2.8e-6
    slice3 = snlab.collective("tpu-v5p-pod", "all-reduce", S, 64, slice="4x4x4")
    ring = snlab.system("tpu-v5p-pod").replace(
        scale_up_topology=Topology("torus", axes=(Axis("ring", 64, b),)), scale_up_domain_size=64,
        scale_up_bandwidth=2 * b)
    lesson = topo.one_ring(snlab.system("tpu-v5p-pod"), 64)          # the what-if notebook 03 uses
    assert lesson.scale_up == ring.scale_up and lesson.name == "tpu-v5p-pod as one ring"
    assert topo.one_ring(snlab.system("trn2-ultraserver"), 64).scale_up.bandwidth == 128e9
    ring1 = snlab.collective(ring, "all-reduce", S, 64)
    assert slice3.time_s == approx(call + 2 * 9 * hop + 2 * 21 * S / (128 * eta * b), rel=1e-12)
    assert ring1.time_s == approx(call + 2 * 63 * hop + 2 * 63 * S / (128 * eta * b), rel=1e-12)
    assert slice3.bus_bandwidth / ring1.bus_bandwidth == approx(3, rel=1e-5)
    one_axis = net.with_slice(hardware(ring), 64)
    assert (float(one_axis.slice_x), float(one_axis.slice_y), float(one_axis.slice_z)) == (64, 1, 1)
    X, Y, Z = topo.slice_columns(Topology("torus", axes=(Axis("ring", 64, b),), wrap_multiple=4), np.asarray([64.0]))
    assert (list(X), list(Y), list(Z)) == ([64], [1], [1])
    assert "x: 4 ring, y: 4 ring, z: 4 ring" in slice3.placement and "x: 64 ring" in ring1.placement


def test_a_line_without_wrap_around_takes_twice_as_long_as_a_ring():
    """On an axis without wrap-around the edge shards travel k - 1 hops one way: (k-1)/k S over
    one path instead of two. A 2x2x4 slice has no wrap-around at all (not whole cubes); a
    4x4x4 one has it on every axis."""
    S = 1e13
    small = snlab.collective("tpu-v5p-pod", "reduce-scatter", S, 4, stride=4, slice="2x2x4")
    cube = snlab.collective("tpu-v5p-pod", "reduce-scatter", S, 4, stride=16, slice="4x4x4")
    assert "z: 4 line" in small.placement and "z: 4 ring" in cube.placement
    assert small.time_s == approx(2.8e-6 + 3e-6 + 3 / 4 * S / (0.9 * 100e9), rel=1e-9)
    assert cube.time_s == approx(2.8e-6 + 3e-6 + 3 / 4 * S / (0.9 * 2 * 100e9), rel=1e-9)


def test_the_v5e_all_gather_by_hand_and_against_the_scaling_book():
    """A 4-chip axis of a v5e slice without wrap-around (8x4, the group 8 ranks apart): the
    scaling book's model gives 560 us for bf16[2048, 8192]; snlab adds the call and the hops:
    3 steps of (1 us + 33.5 MB / 4 at 45 GB/s) after 2.8 us. Measured: 680 us."""
    S = 2048 * 8192 * 2
    t = snlab.collective_time(V5E, "all-gather", S, 4, stride=8, slice="8x4")
    assert t == approx(2.8e-6 + 3 * (1e-6 + S / 4 / (0.9 * 50e9)), rel=1e-9)
    assert t * 1e6 == approx(680, rel=0.20)


def test_strided_groups_share_their_links_and_cross_more_hops():
    """Members 2 apart along an axis share each link with the group beside them (half the
    bandwidth each) and each step crosses 2 hops; a full-mesh axis has a link per pair."""
    hw = net.with_slice(hardware(snlab.system("tpu-v5p-pod")), 256, (8, 8, 4))
    g = topo.group_axes(np.float64(4), np.float64(2), hw)
    assert [float(k) for k in g.size] == [4, 1, 1] and float(g.paths[0]) == 2
    assert float(g.bandwidth[0]) == approx(50e9) and float(g.latency[0]) == approx(2e-6)
    mesh = hardware(snlab.system("atlas-950-superpod"))
    m = topo.group_axes(np.float64(4), np.float64(2), mesh)
    assert [float(k) for k in m.size] == [4, 1, 1] and float(m.paths[0]) == 3 and float(m.bandwidth[0]) == 64e9
    assert float(m.cut[0]) == 4            # 2 x 2 pairs cross the cut of four members


def test_the_rank_layout_fills_the_slice_innermost_first():
    hw = net.with_slice(hardware(snlab.system("tpu-v5p-pod")), 128, (4, 4, 8))
    tp = topo.group_axes(np.float64(4), np.float64(1), hw)
    dp = topo.group_axes(np.float64(32), np.float64(4), hw)
    assert [float(k) for k in tp.size] == [4, 1, 1] and float(tp.paths[0]) == 2
    assert [float(k) for k in dp.size] == [1, 4, 8] and [float(w) for w in dp.paths[1:]] == [2, 2]
    assert float(dp.inner) == 32 and float(dp.slices) == 1
    # a group reaching past its slice spans slices: 128 members of 2 slices of 64
    two = net.with_slice(hardware(snlab.system("tpu-v5p-pod")), 128, (4, 4, 4))
    big = topo.group_axes(np.float64(128), np.float64(1), two)
    assert float(big.inner) == 64 and float(big.slices) == 2
    assert float(topo.group_axes(np.float64(2), np.float64(64), two).inner) == 1
    # a group that does not tile the slice runs as one line through its members
    odd = topo.group_axes(np.float64(3), np.float64(1), hw)
    assert [float(k) for k in odd.size] == [3, 1, 1] and float(odd.paths[0]) == 1
    assert float(odd.bandwidth[0]) == 100e9 and float(odd.steps[0]) == 2


def test_a_fixed_torus_wraps_only_along_a_whole_axis():
    """v5e: a 16x8 slice wraps along its 16 (the pod's axis), not along its 8; Trainium2's
    4x4x4 wraps along every axis; a 2-chip axis is a line."""
    hw = net.with_slice(hardware(snlab.system(V5E)), 128, (16, 8))
    assert [float(w) for w in topo.group_axes(np.float64(128), np.float64(1), hw).paths[:2]] == [2, 1]
    trn = hardware(snlab.system("trn2-ultraserver"))
    g = topo.group_axes(np.float64(64), np.float64(1), trn)
    assert [float(w) for w in g.paths] == [2, 2, 2] and [float(b) for b in g.bandwidth] == [128e9, 128e9, 64e9]
    pair = topo.group_axes(np.float64(2), np.float64(1), trn)
    assert float(pair.paths[0]) == 1 and float(pair.injection) == 128e9


def test_the_torus_all_to_all_is_bounded_by_the_bisection():
    """A ring of k with wrap-around: n S / 4 bytes cross a cut that 2 links per direction
    carry, k S / (8 b); a 4x4x4 slice: the same per axis at k = 4, so 64 chips exchange as
    fast as a ring of 4, eight times faster than a ring of 64."""
    S = 1e12
    cube = snlab.collective_time("tpu-v5p-pod", "all-to-all", S, 64, slice="4x4x4")
    assert cube == approx(2.8e-6 + 9e-6 + 4 * S / (4 * 0.9 * 2 * 100e9), rel=1e-9)
    ring = snlab.system("tpu-v5p-pod").replace(
        scale_up_topology=Topology("torus", axes=(Axis("ring", 64, 100e9),)), scale_up_domain_size=64,
        scale_up_bandwidth=200e9)
    assert snlab.collective_time(ring, "all-to-all", S, 64) == approx(2.8e-6 + 63e-6 + 64 * S / (8 * 0.9 * 100e9),
                                                                     rel=1e-9)
    # the injection limit: a pair on a full mesh exchanges S/2 over one link
    mesh = snlab.collective_time("atlas-950-superpod", "all-to-all", S, 2)
    assert mesh == approx(10e-6 + 1.5e-6 + S / 2 / (0.67 * 64e9), rel=1e-9)


def test_the_nd_mesh_and_its_switch_axis_by_hand():
    """Atlas 950: an 8 x 8 rack group reduces along its board mesh (7 links of 64 GB/s) and
    its rack mesh (7 of 48): axis x carries (S/2)(7/8)(1 + 1/8), axis y the same over
    7 x 48; y is the busiest. Across racks one link of 216 GB/s into the switch layer."""
    S = 1e12
    t = snlab.collective_time("atlas-950-superpod", "reduce-scatter", S, 64)
    load = S / 2 * 7 / 8 * (1 + 1 / 8)
    assert t == approx(10e-6 + 14 * 1.5e-6 + max(load / (0.67 * 7 * 64e9), load / (0.67 * 7 * 48e9)), rel=1e-9)
    t8 = snlab.collective_time("atlas-950-superpod", "reduce-scatter", S, 8, stride=64)
    assert t8 == approx(10e-6 + 7 * 1.5e-6 + 7 / 8 * S / (0.67 * 216e9), rel=1e-9)


def test_slices_across_the_data_centre_network_by_hand():
    """8,192 v5p chips: two 16x16x16 slices; the axis all-reduce inside each, then each chip's
    1/4096 share across the two slices at its 6.25 GB/s of DCN."""
    S = 1e10
    c = snlab.collective("tpu-v5p-pod", "all-reduce", S, 8192)
    load = S / 3 * 15 / 16 * (1 + 1 / 16 + 1 / 256)
    inside = 2 * 45e-6 + 2 * load / (0.9 * 2 * 100e9)
    across = 2 * 1 * 2.7e-6 + 2 * 1 / 2 * (S / 4096) / (0.91 * 6.25e9)
    assert c.time_s == approx(2.8e-6 + inside + across, rel=1e-9)
    assert "then across 2 slices" in c.algorithm


# --- slices ------------------------------------------------------------------------------

@pytest.mark.parametrize("devices, shape", [(64, (4, 4, 4)), (128, (4, 4, 8)), (256, (4, 8, 8)), (512, (8, 8, 8)),
                                            (1024, (8, 8, 16)), (2048, (8, 16, 16)), (4096, (16, 16, 16)),
                                            (6144, (16, 16, 24)), (8192, (16, 16, 16)), (4, (1, 2, 2)),
                                            (12288, (16, 16, 24))])
def test_the_scheduler_gives_google_s_standard_slices(devices, shape):
    """Cloud TPU v5p's slice shapes (4x4x4 ... 16x16x24); beyond 6,144 chips the largest
    slice shape that divides the job (multislice)."""
    assert topo.auto_slice(devices, snlab.system("tpu-v5p-pod").scale_up.topology) == shape


def test_the_slices_a_search_may_pick():
    top = snlab.system("tpu-v5p-pod").scale_up.topology
    assert topo.slices_for(2048, top) == [(8, 16, 16), (16, 8, 16), (16, 16, 8)]
    assert topo.slices_for(4096, top) == [(16, 16, 16)]
    assert (2, 4, 4) in topo.slices_for(32, top) and (1, 1, 32) not in topo.slices_for(32, top)
    assert topo.slices_for(64, snlab.system("trn2-ultraserver").scale_up.topology) == [(4, 4, 4)]
    assert topo.auto_slice(16, snlab.system("trn2-ultraserver").scale_up.topology) == (4, 4, 4)
    assert topo.divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]


def test_the_planners_place_each_job_on_its_slice():
    r = snlab.train("llama3-70b", "tpu7x-pod", dp=64, zero=3, micro_batch=4, global_batch=256, recompute="full")
    assert r.plan["slice"] == "4x4x4"
    wide = snlab.train("llama3-70b", "tpu7x-pod", dp=256, zero=3, micro_batch=4, global_batch=1024, recompute="full")
    long = snlab.train("llama3-70b", "tpu7x-pod", dp=256, zero=3, micro_batch=4, global_batch=1024, recompute="full",
                       slice="4x4x16")
    assert wide.plan["slice"] == "4x8x8" and long.plan["slice"] == "4x4x16"
    assert long.time_s["zero"] != approx(wide.time_s["zero"], rel=1e-3)
    frame = snlab.sweep("llama3-8b", "tpu-v5p-pod", tp=[1, 4], dp=[16, 64], global_batch=64)
    assert set(frame["slice"].astype(str)) == {"2x2x4", "4x4x4", "4x8x8"}
    assert snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=8).plan["slice"] == ""
    with pytest.raises(SnlabError, match="slice"):
        snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=8, slice="4x4x4")
    with pytest.raises(SnlabError, match="slice"):
        snlab.train("llama3-8b", "tpu-v5p-pod", dp=64, global_batch=64, slice="4x4x3")
    with pytest.raises(SnlabError, match="slice"):
        snlab.train("llama3-8b", "tpu-v5p-pod", dp=64, global_batch=64, slice="4x4")
    with pytest.raises(SnlabError, match="whole 4-long cubes"):
        snlab.train("llama3-8b", "tpu-v5p-pod", dp=64, global_batch=64, slice="16x4x1")


def test_search_explores_the_slices():
    """2,048 v5p chips have three slice shapes; the search prices each plan on each and keeps
    the fastest; a fixed slice is respected."""
    best = snlab.search("llama3-70b", "tpu-v5p-pod", devices=2048, global_batch=1024, top=50, tp=[4, 8])
    assert set(best["slice"].astype(str)) <= {"8x16x16", "16x8x16", "16x16x8"} and len(set(best["slice"])) > 1
    fixed = snlab.search("llama3-70b", "tpu-v5p-pod", devices=2048, global_batch=1024, top=5, slice="16x16x8")
    assert set(fixed["slice"].astype(str)) == {"16x16x8"}


# --- collectives everywhere --------------------------------------------------------------

@pytest.mark.parametrize("system", snlab.presets.names("system"))
@pytest.mark.parametrize("op", list(net.COLLECTIVES))
def test_every_system_prices_every_collective_and_names_its_algorithm(system, op):
    for devices in (2, 8, 64):
        c = snlab.collective(system, op, 1e8, devices)
        assert np.isfinite(c.time_s) and c.time_s > 0 and c.algorithm and c.placement, (system, op, devices)
        assert 0 < c.bus_bandwidth < 1e13


def test_bad_collective_inputs_name_the_field():
    with pytest.raises(SnlabError, match="slice"):
        snlab.collective("dgx-h100", "all-reduce", 1e6, 8, slice="2x2x2")
    with pytest.raises(SnlabError, match="e.g. '4x4x4'"):
        snlab.collective("tpu-v5p-pod", "all-reduce", 1e6, 8, slice="two by two")
    with pytest.raises(SnlabError, match="e.g. '4x4x8'"):
        snlab.collective("tpu-v5p-pod", "all-reduce", 1e6, 8, slice="8x8x2")
    with pytest.raises(SnlabError, match="algorithm"):
        snlab.collective("tpu-v5p-pod", "all-reduce", 1e6, 8, algorithm="one-shot")
    with pytest.raises(SnlabError, match="algorithm"):
        snlab.collective("dgx-h100", "all-reduce", 1e6, 8, algorithm="ring-of-fire")
    with pytest.raises(SnlabError, match="algorithm"):
        snlab.collective("dgx-h100", "all-gather", 1e6, 8, algorithm="one-shot")
    with pytest.raises(SnlabError, match="stride"):
        snlab.collective("dgx-h100", "all-reduce", 1e6, 8, stride=0)


def test_the_command_takes_a_slice_and_names_a_bad_one(capsys):
    assert main(["collective", "--system", "tpu-v5p-pod", "--op", "all-reduce", "--bytes", "1e6", "--devices", "8",
                 "--slice", "9x9x9"]) != 0
    err = capsys.readouterr().err
    assert "slice" in err and err.count("\n") == 1
    assert main(["collective", "--system", "tpu-v5p-pod", "--op", "all-reduce", "--bytes", "1e9", "--devices", "64",
                 "--slice", "4x4x4"]) == 0
    out = capsys.readouterr().out
    assert "bidirectional rings" in out and "4x4x4 in the slice" in out


def test_an_oversubscribed_tier_shares_its_links():
    """A 2:1 tier above 16 devices: a group spanning more than 16 gets half its NIC rate
    across domains; one inside stays at the full rate."""
    s = snlab.system("dgx-h100")
    over = s.replace(scale_out_topology=Topology("switch", tiers=2, oversubscription=2.0, tier_devices=16))
    hw, hw2 = hardware(s), hardware(over)
    assert float(net.outer_bandwidth(np.float64(4), np.float64(8), hw2)) == approx(25e9)
    assert float(net.outer_bandwidth(np.float64(2), np.float64(8), hw2)) == approx(50e9)
    assert float(net.outer_bandwidth(np.float64(4), np.float64(8), hw)) == approx(50e9)
    S = 1e11
    inner = 7 / 8 * S / (0.78 * 450e9)
    across = lambda b: 3 / 4 * (S / 8) / (0.91 * b)       # noqa: E731
    fill = 6.6e-6 + 2 * min(4 * 7 * 0.6e-6 + 3 * 2.7e-6, 7 * 0.6e-6 + 2 * 2.7e-6)
    assert snlab.collective_time(s, "all-reduce", S, 32) == approx(fill + 2 * max(inner, across(50e9)), rel=1e-9)
    assert snlab.collective_time(over, "all-reduce", S, 32) == approx(fill + 2 * max(inner, across(25e9)), rel=1e-9)
    up = s.replace(scale_up_topology=Topology("switch", tiers=2, oversubscription=4.0, tier_devices=4))
    assert float(net.inner_bandwidth(np.float64(8), np.float64(1), hardware(up))) == approx(450e9 / 4)
    assert float(net.inner_bandwidth(np.float64(4), np.float64(1), hardware(up))) == approx(450e9)
    assert float(net.inner_bandwidth(np.float64(4), np.float64(2), hardware(up))) == approx(450e9 / 4)


def test_point_to_point_inside_a_mesh_or_torus_takes_one_link():
    S = 1e9
    mesh = hardware(snlab.system("mi300x-platform"))
    assert float(net.point_to_point(S, True, mesh)) == approx(8.2e-6 + 0.6e-6 + S / (0.727 * 64e9), rel=1e-9)
    trn = hardware(snlab.system("trn2-ultraserver"))
    assert float(net.link_bandwidth(trn)) == 64e9 and float(net.link_bandwidth(hardware(snlab.system("dgx-h100")))) \
        == 450e9


def test_the_engines_one_shot_all_reduce_gets_a_mesh_groups_links():
    """vLLM's custom all-reduce on a mesh: a TP-4 group reads its 3 peers over 3 links."""
    from snlab.serving import engine
    hw = hardware(snlab.system("mi300x-platform"))
    S = 16e3
    assert float(engine.tensor_all_reduce(S, np.float64(4), hw)) == approx(5.3e-6 + 0.6e-6 + 3 * S / (0.727 * 3 * 64e9))


def test_the_full_mesh_and_torus_inner_bandwidths():
    mesh = hardware(snlab.system("mi300x-platform"))
    assert float(net.inner_bandwidth(np.float64(4), np.float64(1), mesh)) == 3 * 64e9
    assert float(net.inner_bandwidth(np.float64(1), np.float64(1), mesh)) == 64e9
    tor = net.with_slice(hardware(snlab.system("tpu-v5p-pod")), 64, (4, 4, 4))
    # all-to-all over a 4x4x4 slice: (63/64) S in 4 S / (8 b): 63/32 b per device
    assert float(net.inner_bandwidth(np.float64(64), np.float64(1), tor)) == approx(63 / 32 * 100e9)
    assert net.wiring(mesh) == "mesh" and net.wiring(tor) == "axes" and net.wiring(hardware(snlab.system("dgx-a100"))) \
        == "switch"


def test_a_pair_far_apart_on_a_torus_takes_its_axis_and_a_group_of_one_stays_finite():
    """On a Trn2 UltraServer (4 x 4 x 4 chips; 128 GB/s rings on x and y, 64 GB/s on z) a pair
    16 ranks apart is neighbours along z; a group of one whose stride reaches past the 64
    chips (expert parallelism over whole tensor-parallel groups) has no inner traffic and
    keeps a finite plan."""
    trn = hardware(snlab.system("trn2-ultraserver"))
    assert float(net.inner_bandwidth(np.float64(2), np.float64(1), trn)) == approx(128e9)
    assert float(net.inner_bandwidth(np.float64(2), np.float64(16), trn)) == approx(64e9)
    assert float(net.inner_bandwidth(np.float64(1), np.float64(64), trn)) > 0
    run = snlab.train("deepseek-v3", "trn2-ultraserver", tp=64, pp=3, dp=16, ep=2, global_batch=4096, zero=0)
    assert math.isfinite(run.step_time_s) and 0 < run.mfu < 1


# --- published collective benchmarks ------------------------------------------------------

COLLECTIVE_TABLE = collective_table()


@pytest.mark.parametrize("row", COLLECTIVE_TABLE.to_dict("records"), ids=list(COLLECTIVE_TABLE["id"]))
def test_collective_benchmarks_within_the_regime_tolerance(row, request):
    if row["outside"]:
        request.applymarker(pytest.mark.xfail(strict=True, reason=row["outside"]))
    assert abs(row["error"]) <= row["tolerance"], (row["id"], f"{row['error']:+.1%}")


def test_the_collective_rows_cover_a_mesh_and_a_torus():
    assert set(COLLECTIVE_TABLE["tolerance"]) == {TOLERANCE["collective"]} == {0.20}
    assert {"mi300x-platform", "tpu-v5e-pod"} <= set(COLLECTIVE_TABLE["system"])
    assert set(COLLECTIVE_TABLE["source"]) <= set(bibliography())
    assert COLLECTIVE_TABLE["within"].sum() >= 7


# --- every new system plans a training and a serving job ------------------------------

@pytest.mark.parametrize("system", NEW_SYSTEMS)
def test_every_new_system_plans_a_training_and_a_serving_job(system):
    s = snlab.system(system)
    n = 64 if s.max_devices is None or s.max_devices >= 64 else s.max_devices
    best = snlab.search("llama3-70b", system, devices=n, global_batch=2 * n, top=1)
    assert len(best) == 1 and 0.05 < best["mfu"].iloc[0] < 0.8, system
    r = snlab.serve("llama3-70b", system, tp=8, batch=64, prompt_len=2048, output_len=512, weight_dtype="fp8"
                    if "fp8" in s.device.peak_flops else "bf16")
    assert r.fits and 0 < r.tpot_s < 0.2 and r.ttft_s > 0, system


@pytest.mark.parametrize("system", NEW_SYSTEMS)
def test_every_new_system_is_sourced_and_dated(system):
    """Every number has a known source; sources of systems that are not shipping say so."""
    s = snlab.system(system)
    bib = bibliography()
    for prov in list(s.provenance.values()) + list(s.device.provenance.values()):
        assert prov.source in bib
    assert all(bib[p.source].get("year") for p in s.provenance.values())
    if system == "atlas-950-superpod":
        assert "announced" in s.description and "announced" in s.device.description


# --- topology as data ------------------------------------------------------------------

MESH = '''kind = "system"
name = "my-mesh"
device = "mi300x"
devices_per_node = { value = 8, source = "me" }
[scale_up]
domain_size = { value = 8, source = "me" }
bandwidth = { value = 448, unit = "GB/s", source = "me", convention = "per device, per direction" }
latency = { value = 1, unit = "us", source = "me" }
efficiency = { value = 0.7, source = "me" }
[scale_up.topology]
source = "me"
TOPOLOGY
[scale_out]
bandwidth = { value = 400, unit = "Gb/s", source = "me", convention = "per device, per direction" }
latency = { value = 2, unit = "us", source = "me" }
efficiency = { value = 0.9, source = "me" }
[host]
source = "me"
bandwidth = { value = 63, unit = "GB/s", convention = "per device, per direction" }
latency = "1 us"
capacity = "100 GB"
memory_bandwidth = "80 GB/s"
'''


def load(tmp_path, topology: str, name="my-mesh.toml"):
    path = tmp_path / name
    path.write_text(MESH.replace("TOPOLOGY", topology))
    return snlab.system(str(path))


def test_a_user_file_describes_a_mesh(tmp_path):
    s = load(tmp_path, 'kind = "full-mesh"\ndevices = 8\nlink_bandwidth = "64 GB/s"')
    assert s.scale_up.topology.axes == (Axis("mesh", 8, 64e9, 1),)
    assert snlab.collective(s, "all-reduce", 1e9, 8).algorithm.startswith("ring over the full mesh")


@pytest.mark.parametrize("topology, field, words", [
    ('kind = "ring"', "topology.kind", "switch, full-mesh, torus, nd-full-mesh"),
    ('kind = "full-mesh"\ndevices = 8\nlink_bandwidth = "32 GB/s"', "scale_up.bandwidth", "links give"),
    ('kind = "full-mesh"\ndevices = 4\nlink_bandwidth = "64 GB/s"', "topology.dims", "domain_size = 8"),
    ('kind = "full-mesh"\nlink_bandwidth = "64 GB/s"', "topology.devices", "missing"),
    ('kind = "full-mesh"\ndevices = 8\nlink_bandwidth = "64 GB/s"\ndims = [8]', "topology.dims", "unknown field"),
    ('kind = "torus"\ndims = [2, 4]\nlink_bandwidth = "112 GB/s"\nwrap = [true]', "topology.wrap", "a list of 2"),
    ('kind = "torus"\ndims = [2, 4]\nlink_bandwidth = "112 GB/s"\nwrap = true\nwrap_multiple = 4',
     "topology.wrap", "not both"),
    ('kind = "torus"\ndims = [2, 2, 2, 1]\nlink_bandwidth = "64 GB/s"', "topology.dims", "1 to 3 axes"),
    ('kind = "torus"\ndims = [8, 1]\nlink_bandwidth = "224 GB/s"', "topology.dims[1]", "from 2"),
    ('kind = "torus"\ndims = "8"\nlink_bandwidth = "224 GB/s"', "topology.dims", "a list of 1 to 3"),
    ('kind = "torus"\ndims = [2, 4]\nlink_bandwidth = "112 GB/s"\nwrap = ["yes", true]', "topology.wrap[0]",
     "true or false"),
    ('kind = "nd-full-mesh"\ndims = [2, 4]\nlink_bandwidth = "64 GB/s"\nswitched = [1, 0]', "topology.switched[0]",
     "true or false"),
    ('kind = "switch"\ntiers = 1\noversubscription = 2', "topology.oversubscription", "tiers >= 2"),
    ('kind = "switch"\ntiers = 9', "topology.tiers", "1 to 4"),
    ('kind = "torus"\ndims = [8]\nlink_bandwidth = "-3 GB/s"', "topology.link_bandwidth", ""),
])
def test_a_bad_topology_names_the_field(tmp_path, topology, field, words):
    with pytest.raises(SnlabError) as err:
        load(tmp_path, topology)
    assert field in str(err.value) and words in str(err.value)


def test_topology_relations_checked_on_replace():
    s = snlab.system("tpu-v5p-pod")
    with pytest.raises(SnlabError, match="scale_out.topology.kind"):
        s.replace(scale_out_topology=Topology("torus", axes=(Axis("ring", 8, 1e9),)))
    with pytest.raises(SnlabError, match="wrap_multiple"):
        snlab.system("atlas-950-superpod").replace(scale_up_topology=Topology(
            "nd-full-mesh", axes=snlab.system("atlas-950-superpod").scale_up.topology.axes, wrap_multiple=4))
    with pytest.raises(SnlabError, match="in a torus"):
        s.replace(scale_up_topology=Topology("torus", axes=(Axis("mesh", 6144, 1e9),)))
    with pytest.raises(SnlabError, match="one axis"):
        snlab.system("mi300x-platform").replace(scale_up_topology=Topology(
            "full-mesh", axes=(Axis("mesh", 4, 64e9), Axis("mesh", 2, 64e9))))
    assert s.scale_up.topology.describe() == "torus 16x16x24 (ring, wrap-around on slices of multiples of 4)"
    assert snlab.system("cloudmatrix384-cluster").scale_out.topology.describe() == "switch, 2 tiers"
    assert Topology("switch", tiers=3, oversubscription=2, tier_devices=512).describe() == \
        "switch, 3 tiers, 2:1 above 512 devices"
    assert Axis("ring", 2, 10e9, 2).device_bandwidth == 20e9 and Axis("line", 5, 10e9).device_bandwidth == 20e9
    assert Axis("switch", 128, 10e9).device_bandwidth == 10e9 and Axis("mesh", 5, 10e9, 2).device_bandwidth == 80e9
    assert Topology().devices == 0 and s.scale_up.topology.devices == 6144


def test_topologies_round_trip_through_toml(tmp_path):
    for name in NEW_SYSTEMS + [V5E]:
        s = snlab.system(name)
        path = tmp_path / f"copy-{Path(name).stem}.toml"
        path.write_text(snlab.presets.to_toml(s))
        again = snlab.system(str(path))
        assert again.scale_up.topology == s.scale_up.topology and again.scale_out.topology == s.scale_out.topology


def test_the_slice_a_job_runs_on_must_hold_it():
    with pytest.raises(SnlabError, match="slice"):
        topo.check_slice((4, 4, 4), 96)
    topo.check_slice((4, 4, 4), 128)
    topo.check_slice((4, 4, 4), 32)
    assert topo.slice_text((4.0, 8.0, 8.0)) == "4x8x8" and topo.parse_slice("4X8x8", snlab.system(
        "tpu-v5p-pod").scale_up.topology) == (4, 8, 8)
    X, Y, Z = topo.slice_columns(snlab.system("tpu-v5p-pod").scale_up.topology, np.asarray([64.0, 128.0]))
    assert list(X * Y * Z) == [64, 128] and list(Z) == [4, 8]
    given = topo.slice_columns(snlab.system("tpu-v5p-pod").scale_up.topology, np.asarray([64.0, 64.0]),
                               ([None, (16, 4, 1)], np.asarray([0, 1])))
    assert [list(d) for d in given] == [[4, 16], [4, 4], [4, 1]]
    assert math.prod(topo.auto_slice(64, snlab.system("mi300x-platform").scale_up.topology)) == 8


# --- each term pinned (tests/mutate.py runs this file against snlab/network.py and
# snlab/topology.py) -------------------------------------------------------------------

def test_a_mesh_with_two_links_per_peer():
    base = snlab.system("mi300x-platform")
    s = base.replace(scale_up_topology=Topology("full-mesh", axes=(Axis("mesh", 8, 32e9, 2),)))
    hw = hardware(s)
    assert float(net.inner_bandwidth(np.float64(4), np.float64(1), hw)) == 3 * 2 * 32e9
    nd = base.replace(scale_up_topology=Topology("nd-full-mesh", axes=(Axis("mesh", 2, 32e9, 2),
                                                                       Axis("mesh", 4, 128e9, 1))))
    g = topo.group_axes(np.float64(8), np.float64(1), hardware(nd))
    assert [float(w) for w in g.paths[:2]] == [2, 3] and [float(c) for c in g.cut[:2]] == [2, 4]
    assert float(g.injection) == 2 * 32e9 + 3 * 128e9


def test_small_groups_on_a_torus():
    tor = net.with_slice(hardware(snlab.system("tpu-v5p-pod")), 64, (4, 4, 4))
    # a pair on a line: each sends S/2 over its one link
    assert float(net.inner_bandwidth(np.float64(2), np.float64(1), tor)) == approx(100e9)
    assert float(net.inner_bandwidth(np.float64(1), np.float64(1), tor)) == approx(100e9)
    assert float(net.all_reduce(1e9, np.float64(1), 1.0, tor)) == 0
    assert float(net.reduce_scatter(1e9, np.float64(1), 1.0, tor)) == 0
    assert float(net.all_to_all(1e9, np.float64(1), 1.0, tor)) == 0
    # 8 members 16 apart on a 4x4x4 slice: 4 along z, in 2 slices
    g = topo.group_axes(np.float64(8), np.float64(16), tor)
    assert float(g.inner) == 4 and float(g.slices) == 2 and [float(k) for k in g.size] == [1, 1, 4]
    assert list(net.placements(np.float64(8), np.float64(16), tor)) == [(True, 4.0, 2.0)]
    # members 3 apart do not tile a slice of 4s: one line through them
    odd = topo.group_axes(np.float64(4), np.float64(3), tor)
    assert [float(k) for k in odd.size] == [4, 1, 1] and float(odd.cut[0]) == 1
    S = 1e12
    # one member per slice: the whole exchange crosses the data-centre network
    assert snlab.collective_time("tpu-v5p-pod", "all-to-all", S, 2, stride=64, slice="4x4x4") == \
        approx(2.8e-6 + 2.7e-6 + S / 2 / (0.91 * 6.25e9), rel=1e-9)
    assert snlab.collective_time("tpu-v5p-pod", "all-to-all", S, 3, slice="4x4x4") == \
        approx(2.8e-6 + 2e-6 + 3 * S / (4 * 0.9 * 100e9), rel=1e-9)


def test_slices_padded_to_three_axes():
    v5e = snlab.system(V5E)
    hw = net.with_slice(hardware(v5e), 128, (16, 8))
    assert (float(hw.slice_x), float(hw.slice_y), float(hw.slice_z)) == (16, 8, 1)
    assert float(hw.scale_up_domain_size) == 128
    three = net.with_slice(hardware(snlab.system("tpu-v5p-pod")), 64, (2, 4, 8))
    assert float(three.scale_up_domain_size) == 64 and float(three.slice_x) == 2 and float(three.slice_y) == 4
    whole = hardware(v5e)                      # no slice set: the pod's axes, and nothing beyond them
    assert float(topo.group_axes(np.float64(512), np.float64(1), whole).inner) == 256
    corner = net.with_slice(hardware(snlab.system("tpu-v5p-pod")), 4, (1, 2, 2))
    assert [float(k) for k in topo.group_axes(np.float64(4), np.float64(1), corner).size] == [1, 2, 2]
    placed = net.placed(snlab.system("tpu-v5p-pod"), hardware(snlab.system("tpu-v5p-pod")), np.asarray([128.0, 64.0]))
    assert list(placed.scale_up_domain_size) == [128, 64] and list(placed.slice_z) == [8, 4]
    X, Y, Z = topo.slice_columns(v5e.scale_up.topology, np.asarray([256.0]))
    assert (list(X), list(Y), list(Z)) == ([16], [16], [1])
    assert net.placed(snlab.system("dgx-h100"), hardware(snlab.system("dgx-h100")), 64.0).slice_x == 0
    assert net.with_slice(hardware(snlab.system("mi300x-platform")), 8).slice_x == 0


def test_a_slice_spanning_job_pays_the_larger_call_latency():
    s = snlab.system("tpu-v5p-pod").replace(scale_out_call_latency=20e-6)
    one = snlab.collective_time(s, "reduce-scatter", 1e3, 64)
    two = snlab.collective_time(s, "reduce-scatter", 1e3, 8192)
    assert one == approx(2.8e-6 + 9e-6 + 3 / 4 * 1e3 / 3 * (1 + 1 / 4 + 1 / 16) / (0.9 * 200e9), rel=1e-9)
    assert two > 20e-6 + 45e-6 + 2.7e-6


def test_the_switch_axis_all_to_all_by_hand():
    """Atlas 950: 8 racks through the UB switch layer, a device's one 216 GB/s link binds."""
    S = 1e12
    t = snlab.collective_time("atlas-950-superpod", "all-to-all", S, 8, stride=64)
    assert t == approx(10e-6 + 7 * 1.5e-6 + 7 / 8 * S / (0.67 * 216e9), rel=1e-9)


def test_the_collective_reports_its_algorithm_and_placement():
    c = snlab.collective("tpu-v5p-pod", "all-reduce", 1e9, 4, stride=16)
    assert c.placement == "4 in the slice (z: 4 ring)"
    assert snlab.collective("tpu-v5p-pod", "all-reduce", 1e9, 16).placement == \
        "2x2x4 in the slice (x: 2 line, y: 2 line, z: 4 line)"
    d = snlab.collective("dgx-h100", "all-reduce", 1e9, 32)
    assert d.placement == "8 per scale-up domain x 4 domains"
    assert d.to_dict()["algorithm_bandwidth_bytes_per_s"] == approx(1e9 / d.time_s)
    assert snlab.collective("dgx-h100", "reduce-scatter", 1e9, 32).algorithm == \
        "one ring through every domain (through the switch inside)"
    assert snlab.collective("dgx-h100", "all-to-all", 1e9, 32).algorithm == \
        "pairwise exchange through the switch, both levels at once"
    assert snlab.collective("dgx-h100", "all-to-all", 1e9, 8).algorithm == "pairwise exchange through the switch"
    assert snlab.collective("dgx-h100", "all-to-all", 1e9, 16).algorithm.endswith("both levels at once")
    assert snlab.collective("mi300x-platform", "all-to-all", 1e9, 8).algorithm == \
        "pairwise exchange over each peer's own link"
    assert snlab.collective("dgx-h100", "all-reduce", 1e9, 8, algorithm="one-shot").algorithm.endswith(
        "through the switch")
    assert snlab.collective("tpu-v5p-pod", "all-to-all", 1e9, 64).algorithm.startswith("dimension-ordered all-to-all")
    with pytest.raises(SnlabError, match="algorithm"):
        snlab.collective("mi300x-platform", "all-reduce", 1e6, 4, stride=4, algorithm="one-shot")


def test_the_side_by_side_frame_and_the_system_picker():
    frame = net.collective_frame(["dgx-b200", "mi300x-platform", "tpu-v5p-pod"], "all-reduce", [4, 8], 256e6)
    assert len(frame) == 6 and set(frame["system"]) == {"dgx-b200", "mi300x-platform", "tpu-v5p-pod"}
    row = frame[(frame.system == "mi300x-platform") & (frame.devices == 4)].iloc[0]
    c = snlab.collective("mi300x-platform", "all-reduce", 256e6, 4)
    assert row.bus_bandwidth_gbs == approx(c.bus_bandwidth / 1e9) and row.time_s == approx(c.time_s)
    assert row.placement == c.placement and row.topology == "full-mesh 8 (mesh)"
    from snlab import widgets
    names = [value for _, value in widgets.system_options()]
    assert names[0] == widgets.NO_SYSTEM and set(NEW_SYSTEMS) <= set(names)
    assert widgets._with(("a", "b"), "c") == ("a", "b", "c") and widgets._with(("a", "b"), "b") == ("a", "b")
    assert widgets._with(("a",), widgets.NO_SYSTEM) == ("a",)


def test_a_torus_s_domain_is_its_slice_not_a_sweep_axis():
    with pytest.raises(SnlabError, match="scale_up_domain_size"):
        snlab.sweep("llama3-8b", "tpu-v5p-pod", dp=64, global_batch=64, scale_up_domain_size=[64, 128])
    what_if = snlab.compare.with_scale_up_of("pcie-ethernet-a100", "tpu-v5p-pod")
    assert what_if.scale_up.topology == snlab.system("tpu-v5p-pod").scale_up.topology
    assert snlab.train("llama3-8b", what_if, dp=64, global_batch=64).plan["slice"] == "4x4x4"


def test_the_dashboards_take_any_system():
    from snlab import widgets
    dash = widgets.collective_dashboard()
    dash.controls["compare"].value = "tpu-v5p-pod"
    assert dash.error is None and "dimension-ordered" in dash.summary.value and "in the slice" in dash.summary.value
    dash.controls["compare"].value = "mi300x-platform"
    assert dash.error is None and "full mesh" in dash.summary.value
    plan = widgets.planner_dashboard(devices=64, global_batch=256)
    plan.controls["compare"].value = "tpu7x-pod"
    days = {v["system"] for v in plan.charts["days"].spec["data"]["values"]}
    assert plan.error is None and "tpu7x-pod" in days and len(days) == 3


@settings(max_examples=40, deadline=None)
@given(system=st.sampled_from(["mi300x-platform", "mi355x-platform", "tpu-v5p-pod", "tpu7x-pod", "trn2-ultraserver",
                               "atlas-950-superpod"]),
       op=st.sampled_from(["all-reduce", "reduce-scatter", "all-gather"]), size=st.floats(1.0, 1e11),
       devices=st.sampled_from([2, 3, 4, 6, 8, 16, 32, 64]))
def test_no_group_beats_its_links_and_more_bandwidth_is_never_slower(system, op, size, devices):
    """Inside one domain no collective's bus bandwidth beats the device's links (a
    reduce-scatter must send (n - 1)/n of the buffer out of each device); doubling every
    link never makes a collective slower."""
    s = snlab.system(system)
    c = snlab.collective(s, op, size, devices)
    assert np.isfinite(c.time_s) and c.time_s > 0
    assert c.bus_bandwidth <= s.scale_up.bandwidth * (1 + 1e-9)
    top = s.scale_up.topology
    faster = s.replace(scale_up_bandwidth=2 * s.scale_up.bandwidth, scale_up_topology=Topology(
        top.kind, axes=tuple(Axis(a.kind, a.size, 2 * a.link_bandwidth, a.links) for a in top.axes),
        wrap_multiple=top.wrap_multiple))
    assert snlab.collective(faster, op, size, devices).time_s <= c.time_s * (1 + 1e-12)


def test_a_sweep_of_the_level_bandwidth_scales_every_link():
    """``scale_up_bandwidth`` is a device's total over its links: sweeping it on a mesh or a
    torus scales each link alike, so twice the level halves a large collective's time."""
    for system, n in (("mi300x-platform", 8), ("tpu-v5p-pod", 64), ("atlas-950-superpod", 64)):
        base = net.with_slice(hardware(snlab.system(system)), n)
        fast = base.replace(scale_up_bandwidth=2 * base.scale_up_bandwidth)
        assert float(topo.link_scale(fast)) == 2 and float(topo.link_scale(base)) == 1
        assert float(net.inner_bandwidth(np.float64(n), np.float64(1), fast)) == \
            approx(2 * float(net.inner_bandwidth(np.float64(n), np.float64(1), base)))
        assert float(net.link_bandwidth(fast)) == approx(2 * float(net.link_bandwidth(base)))
        S = 1e13
        slow_t = float(net.reduce_scatter(S, np.float64(n), 1.0, base))
        assert float(net.reduce_scatter(S, np.float64(n), 1.0, fast)) == approx(slow_t / 2, rel=1e-3)
    atlas = hardware(snlab.system("atlas-950-superpod")).replace(scale_up_bandwidth=2e12)
    racks = topo.group_axes(np.float64(8), np.float64(64), atlas)
    assert float(racks.bandwidth[2]) == approx(2 * 216e9) and float(racks.size[2]) == 8
    g = topo.group_axes(np.float64(64), np.float64(1), net.with_slice(
        hardware(snlab.system("trn2-ultraserver")).replace(scale_up_bandwidth=320e9), 64))
    assert [float(b) for b in g.bandwidth] == [64e9, 64e9, 32e9]
    odd = topo.group_axes(np.float64(3), np.float64(1), hardware(snlab.system("trn2-ultraserver")).replace(
        scale_up_bandwidth=320e9))
    assert float(odd.bandwidth[0]) == 32e9
    sweep = snlab.sweep("llama3-8b", "mi300x-platform", tp=8, global_batch=8,
                        scale_up_bandwidth=[224e9, 448e9, 896e9])
    assert list(sweep["time_tp_s"]) == sorted(sweep["time_tp_s"], reverse=True)


def test_divisors_are_every_divisor_once_in_order():
    from snlab.topology import divisors
    for n in [*range(1, 200), 384, 4096, 9216, -12]:
        assert divisors(n) == [d for d in range(1, abs(n) + 1) if n % d == 0], n
    assert divisors(0) == []


def test_a_slice_of_a_pod_pays_its_share_of_the_pod_s_switches():
    # a job on 8 or 64 of the 9,216 chips of a TPU7x pod: each chip carries a quarter of its
    # host, 1/9,216 of the pod's optical switches and optics, and its own network share
    pod = snlab.system("tpu7x-pod")
    share = pod.power.host_power / 4 + pod.power.switch_power / 9216 + pod.power.network_power
    for dp in (8, 64):
        r = snlab.train("llama3-8b", "tpu7x-pod", tp=1, dp=dp, global_batch=64)
        assert r.it_power_w / dp - r.device_power_w == pytest.approx(share)


def test_a_collective_s_slice_holds_its_devices_as_a_training_plan_s_does():
    with pytest.raises(snlab.SnlabError, match=r"^slice: 3x3x3 holds 27 devices; the job has 64"):
        snlab.collective("tpu-v5p-pod", "all-reduce", 1e9, 64, slice="3x3x3")
    # 24 devices a stride of 2 apart span 48: more than a slice of 32 and no multiple of it
    with pytest.raises(snlab.SnlabError, match=r"^slice: 4x4x2 holds 32 devices; the job has 48"):
        snlab.collective("tpu-v5p-pod", "all-reduce", 1e9, 24, stride=2, slice="4x4x2")
    # two slices of 32: the rest of the all-reduce crosses the scale-out network
    assert snlab.collective("tpu-v5p-pod", "all-reduce", 1e9, 64, slice="4x4x2").time_s > 0
