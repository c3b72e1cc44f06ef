"""The communication wall: alpha-beta cost of point-to-point messages and collectives.

A message of S bytes costs alpha + S / beta (Hockney 1994, Parallel Computing 20(3)).
Collective costs over n devices with per-device, per-direction bandwidth beta follow
Thakur, Rabenseifner and Gropp 2005 (IJHPCA 19(1)) and Patarasuk and Yuan 2009 (JPDC
69(2)) for rings, and Sanders, Speck and Traff 2009 (Parallel Computing 35(12)) for the
double binary tree. Every bandwidth term is divided by an achievable-efficiency factor
eta (NCCL's measured bus bandwidth over the line rate), and every call pays a fixed
alpha_0 (NCCL's base latency per collective, launch and synchronisation included). S is the full buffer each device
holds (all-reduce, reduce-scatter input, all-gather output, all-to-all send buffer).
"""

from __future__ import annotations

import sympy as sp

from ..formula import Formula
from ..symbols import sym

S, n, alpha, beta, eta = (sym.message_bytes, sym.group_size, sym.latency,
                          sym.link_bandwidth, sym.link_efficiency)
a0 = sym.call_latency
n1, n2 = sym.inner_size, sym.outer_size
a1, b1, e1 = sym.inner_latency, sym.inner_bandwidth, sym.inner_efficiency
a2, b2, e2 = sym.outer_latency, sym.outer_bandwidth, sym.outer_efficiency

point_to_point_time = Formula(
    "point_to_point_time", "time",
    a0 + alpha + S / (eta * beta),
    "Hockney 1994",
    "One message of S bytes between two devices.",
)

v_, tau_v = sym.interleave, sym.chunk_overhead

interleave_handshakes = Formula(
    "interleave_handshakes", "time",
    2 * (v_ - 1) * tau_v,
    "Qi et al. 2024 (Zero Bubble Pipeline Parallelism, ICLR), Tables 4, 5 and 9: Megatron-LM's "
    "interleaved 1F1B, one layer per chunk, measured against its modelled bubble and sends",
    "Per micro-batch, what a stage's v - 1 extra model chunks cost beyond their compute and "
    "their sends: a forward and a backward pass through each, tau_v apiece (the wait on the "
    "neighbouring stage and the launches around it). It cannot hide behind compute.",
)

ring_all_reduce_time = Formula(
    "ring_all_reduce_time", "time",
    a0 + 2 * (n - 1) * alpha + 2 * (n - 1) / n * S / (eta * beta),
    "Patarasuk and Yuan 2009; Thakur et al. 2005 (reduce-scatter then all-gather)",
    "Ring all-reduce: 2(n-1) steps, each device sends 2(n-1)/n of the buffer.",
)

direct_all_reduce_time = Formula(
    "direct_all_reduce_time", "time",
    a0 + alpha + (n - 1) * S / (eta * beta),
    "one-shot all-reduce as the inference engines run it (vLLM csrc/custom_all_reduce.cuh, SGLang and "
    "TensorRT-LLM's custom all-reduce): every device reads each peer's whole buffer over the scale-up "
    "links and reduces it locally; calibrated on SGLang PR 2904's H100 TP 8 table",
    "One-shot all-reduce of an S-byte buffer over n devices of one scale-up domain: a "
    "single step of latency, then (n - 1) S bytes into each device. It beats the ring "
    "for the small messages of a decode step, which pay 2(n - 1) ring steps otherwise.",
)

tree_all_reduce_time = Formula(
    "tree_all_reduce_time", "time",
    a0 + 2 * sp.log(n, 2) * alpha + 2 * S / (eta * beta),
    "Sanders, Speck, Traff 2009 (two-tree reduce then broadcast, pipelined)",
    "Double-binary-tree all-reduce: latency grows as log2 n, not n; each device "
    "sends about 2S.",
)

reduce_scatter_time = Formula(
    "reduce_scatter_time", "time",
    a0 + (n - 1) * alpha + (n - 1) / n * S / (eta * beta),
    "Thakur et al. 2005 (ring reduce-scatter)",
    "Ring reduce-scatter of an S-byte buffer: each device ends with S/n reduced bytes.",
)

all_gather_time = Formula(
    "all_gather_time", "time",
    reduce_scatter_time.expr,  # the same ring, run the other way
    "Thakur et al. 2005 (ring all-gather)",
    "Ring all-gather into an S-byte buffer: each device contributes S/n.",
)

all_to_all_time = Formula(
    "all_to_all_time", "time",
    reduce_scatter_time.expr,  # the same cost: n - 1 steps, (n - 1)/n of S leaves each device
    "Thakur et al. 2005 (pairwise exchange on a non-blocking fabric)",
    "All-to-all: each device sends S (n-1)/n bytes to the n-1 others.",
)

hierarchical_all_reduce_time = Formula(
    "hierarchical_all_reduce_time", "time",
    a0 + 2 * sp.Min(n2 * (n1 - 1) * a1 + (n2 - 1) * a2, (n1 - 1) * a1 + sp.log(n2, 2) * a2)
    + 2 * sp.Max((n1 - 1) / n1 * S / (e1 * b1), (n2 - 1) / n2 * (S / n1) / (e2 * b2)),
    "NCCL's ring over several nodes (src/graph/connect.cc connectRings; src/device/reduce_scatter.h "
    "runRing): one flat ring per channel enters and leaves each node once, with 8 chunks in flight, "
    "so the slower level sets the bandwidth; its latency model (src/graph/tuning.cc) counts every "
    "step of that ring, n_2 (n_1 - 1) inside domains and n_2 - 1 between them, each at its own "
    "level's latency; where the double binary tree fills faster (log2 n_2 steps between domains, "
    "Sanders, Speck and Traff 2009) NCCL picks it. Jia et al. 2018 (arXiv 1807.11205) Sec. 4.2 "
    "for the 1/n_1 share",
    "Two-level all-reduce over n_1 devices per domain and n_2 domains. A ring visits every "
    "device, so its pipeline fill pays each step's latency on its own level; a tree crosses "
    "log2 n_2 levels between domains; the faster fill counts, then the data flows at the pace "
    "of the slower level. Across domains each device sends its 1/n_1 share through its own "
    "NIC (rails), so a domain of n_1 devices moves n_1 NICs' worth: NCCL's bus bandwidth is "
    "about min(n_1/(n_1 - 1) eta_1 beta_1, n_1 eta_2 beta_2).",
)

hierarchical_reduce_scatter_time = Formula(
    "hierarchical_reduce_scatter_time", "time",
    a0 + n2 * (n1 - 1) * a1 + (n2 - 1) * a2
    + sp.Max((n1 - 1) / n1 * S / (e1 * b1), (n2 - 1) / n2 * (S / n1) / (e2 * b2)),
    "as hierarchical_all_reduce_time, one half (NCCL runs reduce-scatter and all-gather "
    "as the same pipelined ring)",
    "Two-level reduce-scatter (the same cost as the two-level all-gather): the fill latency "
    "of every step of the ring, then the slower level's share.",
)

hierarchical_all_to_all_time = Formula(
    "hierarchical_all_to_all_time", "time",
    a0 + sp.Max((n1 - 1) * a1 + (n1 - 1) / (n1 * n2) * S / (e1 * b1),
           (n2 - 1) * a2 + (n2 - 1) / n2 * S / (e2 * b2)),
    "alpha-beta model on two levels; the levels run concurrently",
    "All-to-all over n_1 n_2 devices: the share for peers in the same domain crosses "
    "the scale-up level, the rest the scale-out level, at the same time; remote "
    "messages to one domain are counted as one step.",
)

# --- beyond one switch: tori and full meshes ------------------------------------------
#
# A group on a torus or a full mesh spans up to three axes (x, y, z); on each it has k
# members, w disjoint paths per direction, sigma steps, links of bandwidth beta (its share
# of them) and a latency per step. An unused axis has k = 1 and drops out of every term.

_AXES = "xyz"
k = {a: getattr(sym, f"axis_size_{a}") for a in _AXES}
w = {a: getattr(sym, f"axis_paths_{a}") for a in _AXES}
sigma = {a: getattr(sym, f"axis_steps_{a}") for a in _AXES}
cut = {a: getattr(sym, f"axis_cut_{a}") for a in _AXES}
b_ax = {a: getattr(sym, f"axis_bandwidth_{a}") for a in _AXES}
a_ax = {a: getattr(sym, f"axis_latency_{a}") for a in _AXES}
#: 1 on an axis the group uses (k >= 2), 0 on one it does not (k = 1)
used = {a: sp.Min(k[a] - 1, 1) for a in _AXES}
#: chunks the buffer is cut into: one per used axis (at least one, for a group with a
#: single member per slice, whose slices then do all the work)
axes_used = sp.Max(sum(used.values()), 1)
#: the order in which each chunk visits the axes: chunk x goes x, y, z; chunk y goes y, z, x;
#: chunk z goes z, x, y, so that at the start every used axis carries a chunk
_ORDER = {"x": "xyz", "y": "yzx", "z": "zxy"}


def _axis_load(S_, axis: str):
    """Bytes each device sends along ``axis`` per direction-path in a dimension-ordered
    reduce-scatter of an S-byte buffer split into one chunk per used axis: a chunk that
    reaches the axis after others has been reduced by their sizes first."""
    total = 0
    for chunk, order in _ORDER.items():
        before = order[:order.index(axis)]
        total += used[chunk] / sp.Mul(*[k[b] for b in before])
    return S_ / axes_used * (k[axis] - 1) / k[axis] * total


_axis_latency = sum(sigma[a] * a_ax[a] for a in _AXES)
_axis_bandwidth_time = sp.Max(*[_axis_load(S, a) / (eta * w[a] * b_ax[a]) for a in _AXES])
_AXIS_SOURCE = ("dimension-ordered collectives with one chunk per axis, rotated so that every axis works at once "
                "(Austin et al. 2025, How to Scale Your Model, Part 3, 'AllGather over multiple axes'; Chan et al. "
                "2007, Concurrency and Computation 19(13), bucket algorithms on meshes and tori); a bidirectional ring "
                "per torus axis (Patarasuk and Yuan 2009), a direct exchange per full-mesh axis (Bruck et al. 1997)")

axis_reduce_scatter_time = Formula(
    "axis_reduce_scatter_time", "time",
    a0 + _axis_latency + _axis_bandwidth_time,
    _AXIS_SOURCE,
    "Reduce-scatter (or all-gather) of an S-byte buffer over a group that spans up to three axes "
    "of a torus or full mesh. The buffer is cut into one chunk per used axis; each chunk is "
    "reduced along every axis in turn, starting on its own, so all axes carry data at once. A "
    "chunk arriving on an axis after others is already 1/k of its size per axis passed. The "
    "busiest axis sets the pace: its bytes over its paths and links; each axis adds its steps' "
    "latency.",
)

axis_all_reduce_time = Formula(
    "axis_all_reduce_time", "time",
    a0 + 2 * _axis_latency + 2 * _axis_bandwidth_time,
    _AXIS_SOURCE,
    "All-reduce over up to three axes: the dimension-ordered reduce-scatter, then the same "
    "all-gather in reverse. On a k x k x k torus each axis carries a third of the data, so "
    "a large all-reduce gets three times the bus bandwidth of one ring of the same k^3 chips "
    "and links.",
)

axis_all_to_all_time = Formula(
    "axis_all_to_all_time", "time",
    a0 + _axis_latency + sp.Max(*[used[a] * k[a] * S / (4 * eta * cut[a] * b_ax[a]) for a in _AXES],
                               (n - 1) / n * S / (eta * beta)),
    "bisection bound of a uniform all-to-all (Dally and Towles 2004, Principles and Practices of "
    "Interconnection Networks, Sec. 3.3): across a cut halving the group along an axis, half the "
    "devices send a quarter of all bytes to the other half; dimension-ordered routing with one "
    "chunk per axis loads each axis with the whole buffer once",
    "All-to-all of an S-byte send buffer over a group of n = k_x k_y k_z devices on a torus or "
    "full mesh: n S / 4 bytes cross each axis's bisection, which has n / k lines of c links "
    "per direction, so the axis takes k S / (4 c beta); a device cannot inject faster than its "
    "links beta (per device, per direction). A longer axis, or one without wrap-around (c = 1 "
    "instead of 2), is slower: the bisection limit.",
)

_slices = k["x"] * k["y"] * k["z"]

sliced_all_reduce_time = Formula(
    "sliced_all_reduce_time", "time",
    axis_all_reduce_time.expr + 2 * sp.Min((n2 - 1) * a2, sp.log(n2, 2) * a2)
    + 2 * (n2 - 1) / n2 * (S / _slices) / (e2 * b2),
    "reduce-scatter inside each slice (or supernode), all-reduce of each device's 1/n_1 share "
    "across them, all-gather inside (Jia et al. 2018, arXiv 1807.11205, Sec. 4.2; XLA's "
    "multi-slice all-reduce over the data-centre network, Google Cloud TPU multislice docs)",
    "All-reduce over n_2 slices of a torus or full mesh joined by a scale-out network: the "
    "axis all-reduce inside each slice, then each device all-reduces its 1/(k_x k_y k_z) share "
    "with its peers in the other slices through its own NIC, as a ring or a tree.",
)

sliced_reduce_scatter_time = Formula(
    "sliced_reduce_scatter_time", "time",
    axis_reduce_scatter_time.expr + (n2 - 1) * a2 + (n2 - 1) / n2 * (S / _slices) / (e2 * b2),
    "as sliced_all_reduce_time, one half",
    "Reduce-scatter (or all-gather) over n_2 slices: inside each slice, then the 1/(k_x k_y k_z) "
    "share across them.",
)

sliced_all_to_all_time = Formula(
    "sliced_all_to_all_time", "time",
    a0 + sp.Max(axis_all_to_all_time.expr.subs(a0, 0).subs(S, S / n2),
                (n2 - 1) * a2 + (n2 - 1) / n2 * S / (e2 * b2)),
    "as hierarchical_all_to_all_time: the share for peers in the same slice crosses its axes, "
    "the rest the scale-out network, at the same time",
    "All-to-all over n_2 slices: each device's 1/n_2 for peers in its own slice goes over the "
    "slice's axes, the rest through its NIC, concurrently.",
)

bus_bandwidth = Formula(
    "bus_bandwidth", "link_bandwidth",
    S / sym.time * 2 * (n - 1) / n,
    "NCCL tests, doc/PERFORMANCE.md (busbw = algbw x 2(n-1)/n for all-reduce)",
    "NCCL's bus bandwidth of an all-reduce that took tau: comparable to link bandwidth.",
)

scatter_bus_bandwidth = Formula(
    "scatter_bus_bandwidth", "link_bandwidth",
    S / sym.time * (n - 1) / n,
    "NCCL tests, doc/PERFORMANCE.md (busbw = algbw x (n-1)/n for reduce-scatter, all-gather, all-to-all)",
    "NCCL's bus bandwidth of a reduce-scatter, all-gather or all-to-all of an S-byte buffer "
    "that took tau.",
)

# --- overlap ------------------------------------------------------------------------

tc, tm, eps, kap = sym.compute_time, sym.comm_time, sym.overlap, sym.overlap_contention

overlapped_time = Formula(
    "overlapped_time", "time",
    tc + tm - (1 - kap) * eps * sp.Min(tc, tm),
    "an overlap level in [0, 1] (0 gives C + M, 1 with kappa = 0 gives max(C, M)); the contention "
    "kappa from Lee et al. 2025 (arXiv 2507.03114), who measure compute kernels 18.9% slower on "
    "average (40% at most) while collectives run beside them on A100, H100, MI250 and MI210",
    "Time of compute and communication that can run concurrently, with a fraction epsilon of "
    "the shorter one hidden. Hiding is not free: communication kernels take SMs and HBM "
    "bandwidth from the compute they run beside, which slows down by a fraction kappa of the "
    "time hidden.",
)
