"""The network: where a group of devices sits on a system's levels, and what a
collective over it costs.

A system has two levels: a scale-up domain (NVLink, a PCIe switch, a supernode's bus)
of ``scale_up_domain_size`` devices, and a scale-out network between domains. Ranks
are laid out in Megatron-LM's order (tensor innermost, then context, data with expert
inside it, pipeline outermost), so a group whose members sit ``stride`` ranks apart has
``n1`` members per domain and spans ``n2`` domains (:func:`split`). A group inside one
domain pays the scale-up level; a group spanning domains pays a two-level collective
(:mod:`snlab.walls.communication`). Every function here takes a
:class:`~snlab.hardware.Hardware` and broadcasts over numpy arrays.
"""

from __future__ import annotations

import numpy as np

from .grid import where

from .hardware import ACTIVATION_BYTES, Hardware
from .walls import communication as cm
from .walls import serving as sv

#: expert-parallel kernels -> the level field of their achieved bandwidth fraction: the
#: low-latency dispatch and combine of decode, the high-throughput ("bulk") ones of
#: prefill and training
EP_KERNELS = {"dispatch": "ep_dispatch_efficiency", "combine": "ep_combine_efficiency", "bulk": "ep_bulk_efficiency"}


def per_domain(stride, hw: Hardware):
    """Members of a group ``stride`` ranks apart that one scale-up domain can hold (at
    least one: members farther apart than a domain sit on a domain each)."""
    return np.maximum(np.floor(hw.scale_up_domain_size / stride), 1.0)


def split(n, stride, hw: Hardware):
    """Members of a group per scale-up domain (n1) and domains spanned (n2) as the
    domain places it when every domain holds an equal share: n1 is the largest divisor
    of n that one domain holds (:func:`per_domain`). A domain of 6 holds a group of 8 as
    4 + 4, not 6 + 2: a scheduler gives each domain the same share, so that every member
    has a peer in the other domains to send its share to (rails)."""
    shares = None
    for fits, n1, _ in placements(n, stride, hw):
        shares = n1 if shares is None else where(fits, n1, shares)
    return shares, n / shares


_DIVISORS: dict[int, tuple[float, ...]] = {}


def divisors(n: int) -> tuple[float, ...]:
    """The divisors of the whole number ``n`` in increasing order, as floats (kept once found)."""
    found = _DIVISORS.get(n)
    if found is None:
        import sympy
        found = _DIVISORS[n] = tuple(float(d) for d in sympy.divisors(n))
    return found


def placements(n, stride, hw: Hardware):
    """Every way a group of n members ``stride`` ranks apart may sit on the levels, as
    (fits, n1, n2) triples in increasing n1: n1 members in each of n2 = n / n1 domains,
    for every n1 that divides n; ``fits`` says, row by row, whether a domain holds n1
    members (:func:`per_domain`). The first, a member per domain, always fits. A
    scheduler may place a group on fewer devices per domain than the domain could hold,
    and a collective library may leave part of a domain to the scale-out network (NCCL
    with NCCL_MNNVL_ENABLE=0 runs a GB200 NVL72 as eighteen trays over InfiniBand): a
    two-level collective moves less over the scale-up links (each member's 1/n1 share
    crosses the NICs in parallel). A larger domain only adds placements, so pricing at
    the fastest placement means a larger domain is never slower."""
    yield True, 1.0, n
    cap = per_domain(stride, hw)
    sizes = np.unique(np.asarray(n, dtype=float))
    sizes = sizes[np.isfinite(sizes) & (sizes == np.round(sizes)) & (np.abs(sizes) <= MAX_GROUP)]
    found = {d for v in sizes for d in divisors(int(v))[1:]}
    if found:                                   # (an empty grid has no sizes)
        top = float(np.max(cap))
        for n1 in sorted(d for d in found if d <= top):
            yield (np.mod(n, n1) == 0) & (n1 <= cap), n1, n / n1


def fastest(price, n, stride, hw: Hardware):
    """The lowest of ``price(n1, n2)`` over the group's :func:`placements`."""
    best = None
    for fits, n1, n2 in placements(n, stride, hw):
        t = price(n1, n2)
        best = t if best is None else where(fits, np.minimum(best, t), best)
    return best


def inner_step_latency(n1, hw: Hardware, stride=1.0):
    """Mean latency of one ring step inside a scale-up domain [s]: a ring of n1 devices
    ``stride`` ranks apart has n1 hops; in a domain that spans several nodes
    (CloudMatrix384's 48 nodes on one bus) the k hops between the group's k nodes pay
    ``scale_up_latency`` and the others ``scale_up_node_latency`` (members
    ``devices_per_node`` or more ranks apart each sit on a node of their own). A group of
    one (a point-to-point message) pays the first."""
    per_node = np.maximum(np.minimum(n1, np.floor(hw.devices_per_node / stride)), 1.0)
    k = np.ceil(n1 / per_node)
    crossing = where(k > 1, k, 0.0)
    return where(n1 > 1, ((n1 - crossing) * hw.scale_up_node_latency + crossing * hw.scale_up_latency) / n1,
                 hw.scale_up_latency)


def levels(n1, n2, hw: Hardware, stride=1.0) -> dict:
    """The two-level collective formulas' inputs for a group of n1 x n2 devices
    ``stride`` ranks apart: each ring step pays its own level's latency
    (:func:`inner_step_latency` inside a domain); a call spanning domains pays the larger
    of the two levels' per-call latencies."""
    spans = n2 > 1
    return dict(
        inner_size=n1, outer_size=n2,
        inner_latency=inner_step_latency(n1, hw, stride), inner_bandwidth=hw.scale_up_bandwidth,
        inner_efficiency=hw.scale_up_efficiency,
        outer_latency=hw.scale_out_latency, outer_bandwidth=hw.scale_out_bandwidth,
        outer_efficiency=hw.scale_out_efficiency,
        call_latency=where(spans, np.maximum(hw.scale_up_call_latency, hw.scale_out_call_latency),
                              hw.scale_up_call_latency),
    )


def all_reduce(S, n, stride, hw: Hardware):
    """Time of an all-reduce of S bytes over n devices ``stride`` ranks apart [s], at
    the fastest of the group's :func:`views`."""
    t = fastest(lambda n1, n2: cm.hierarchical_all_reduce_time(message_bytes=S, **levels(n1, n2, hw, stride)), n, stride, hw)
    return where(n > 1, t, 0.0)


def reduce_scatter(S, n, stride, hw: Hardware):
    """Time of a reduce-scatter (or all-gather) of an S-byte buffer [s]."""
    t = fastest(lambda n1, n2: cm.hierarchical_reduce_scatter_time(message_bytes=S, **levels(n1, n2, hw, stride)),
                n, stride, hw)
    return where(n > 1, t, 0.0)


def all_to_all(S, n, stride, hw: Hardware):
    """Time of an all-to-all of an S-byte send buffer [s]."""
    t = fastest(lambda n1, n2: cm.hierarchical_all_to_all_time(message_bytes=S, **levels(n1, n2, hw, stride)), n, stride, hw)
    return where(n > 1, t, 0.0)


def point_to_point(S, inside, hw: Hardware):
    """One message of S bytes, inside a scale-up domain or across domains [s]; inside
    a domain it takes the faster of the two paths (a device keeps its NIC)."""
    up = cm.point_to_point_time(message_bytes=S, latency=hw.scale_up_latency, link_bandwidth=hw.scale_up_bandwidth,
                                link_efficiency=hw.scale_up_efficiency, call_latency=hw.scale_up_call_latency)
    out = cm.point_to_point_time(message_bytes=S, latency=hw.scale_out_latency,
                                 link_bandwidth=hw.scale_out_bandwidth, link_efficiency=hw.scale_out_efficiency,
                                 call_latency=hw.scale_out_call_latency)
    return where(inside, np.minimum(up, out), out)


def one_shot_all_to_all(S_in, S_out, n1, n2, hw: Hardware, kernel: str | None = None, stride=1.0):
    """One-shot all-to-all [s] sending S_in bytes to peers in the domain and S_out to
    other domains; ``kernel`` (a key of :data:`EP_KERNELS`) picks the achieved bandwidth
    fraction of that expert-parallel kernel on each level where the preset measures it,
    the level's ``efficiency`` elsewhere."""
    lv = levels(n1, n2, hw, stride)
    del lv["inner_size"], lv["outer_size"]
    if kernel is not None:
        field = EP_KERNELS[kernel]
        for level, key in (("scale_up", "inner_efficiency"), ("scale_out", "outer_efficiency")):
            own = np.asarray(getattr(hw, f"{level}_{field}"))
            lv[key] = where(own > 0, own, lv[key])
    return sv.direct_all_to_all_time(inner_bytes=S_in, outer_bytes=S_out, **lv)


def expert_calls(tokens, experts_per_token, hidden, ep, dispatch_bytes, hw: Hardware, bulk, stride=1.0,
                 domain_cap=None, as_placed=False):
    """Seconds of one expert dispatch and one combine (one MoE layer, one micro-batch)
    when each of ``ep`` devices sends ``tokens`` tokens of ``hidden`` elements to their
    tokens' ``experts_per_token`` experts.

    Low-latency kernels (``bulk`` False: decode) write every (token, expert) copy
    straight to the expert's device; high-throughput ones (``bulk`` True: prefill) send
    a token once per remote domain and forward it inside the domain (DeepEP normal
    kernels). Dispatch moves ``dispatch_bytes`` per element, combine 16-bit. Bytes to a
    device's sibling dies stay on the package, so the remote share is counted in
    devices (packages), not ranks. The expert group's members sit ``stride`` ranks
    apart; ``domain_cap`` bounds the remote domains a token reaches (group-limited
    routing: DeepSeek-V3 sends a token to at most 4 nodes). The expert kernels measured
    (DeepEP, Zuo et al.) keep a domain's traffic on its scale-up links; the group is
    priced at its fastest :func:`placements` (the same for dispatch and combine), so a
    domain that grows to hold the whole group never makes the exchange slower; with
    ``as_placed`` at the placement the domain gives it (:func:`split`), as the kernels'
    microbenchmarks ran.
    """
    if as_placed:
        n1, n2 = split(ep, stride, hw)
        return _expert_calls_on(n1, n2, tokens, experts_per_token, hidden, dispatch_bytes, hw, bulk, stride,
                                domain_cap)
    best = None
    for fits, n1, n2 in placements(ep, stride, hw):
        disp, comb = _expert_calls_on(n1, n2, tokens, experts_per_token, hidden, dispatch_bytes, hw, bulk, stride,
                                      domain_cap)
        if best is None:
            best = disp + comb, disp, comb
        else:
            better = fits & (disp + comb < best[0])
            best = tuple(where(better, new, old) for new, old in zip((disp + comb, disp, comb), best))
    return best[1:]


def _expert_calls_on(n1, n2, tokens, experts_per_token, hidden, dispatch_bytes, hw: Hardware, bulk, stride,
                     domain_cap):
    """:func:`expert_calls` with the expert group placed as n1 members in each of n2 domains."""
    sent = tokens * experts_per_token * hidden     # (token, expert) copies per device, in elements
    inner = sent * (n1 - 1) / where(bulk, n1, n1 * n2)
    if bulk:
        domains = sv.domains_per_token(outer_size=n2, experts_per_token=experts_per_token)
        if domain_cap is not None:
            domains = np.minimum(domains, domain_cap(n2))
        outer = tokens * hidden * domains * (n2 - 1) / n2
    else:
        outer = sent * (n2 - 1) / n2
    disp = one_shot_all_to_all(inner * dispatch_bytes, outer * dispatch_bytes, n1, n2, hw,
                               "bulk" if bulk else "dispatch", stride)
    comb = one_shot_all_to_all(inner * ACTIVATION_BYTES, outer * ACTIVATION_BYTES, n1, n2, hw,
                               "bulk" if bulk else "combine", stride)
    return disp, comb


def expert_all_to_all_time(system, *, ranks: int, tokens_per_rank: float = 128, hidden: int = 7168,
                           experts_per_token: int = 8, collective: str = "dispatch", prefill: bool = False,
                           dispatch_bytes: float = 1.0) -> float:
    """Seconds of one expert dispatch or combine as snlab prices it, in the setting of
    the published microbenchmarks: ``ranks`` ranks (dies of a multi-die package count
    one each) sending ``tokens_per_rank`` tokens of ``hidden`` elements to
    ``experts_per_token`` experts; dispatch in ``dispatch_bytes`` bytes per element
    (8-bit by default), combine in 16-bit. ``prefill`` picks the high-throughput kernels.

    DeepEP's tables (128 tokens, 7168 hidden, top-8) and Zuo et al.'s Sec. 5 comparison
    use exactly this setting, so this is how the presets' kernel efficiencies are checked
    against them (tests/test_serving_microbench.py).
    """
    from .errors import SnlabError
    from .hardware import hardware
    from .presets import system as load_system
    if collective not in ("dispatch", "combine"):
        raise SnlabError("collective", f"got {collective!r}", "dispatch, combine")
    hw = hardware(load_system(system))
    devices = ranks / hw.dies
    q_dispatch = 1.0 if dispatch_bytes <= 1 else ACTIVATION_BYTES   # 8-bit, else 16-bit
    disp, comb = expert_calls(tokens_per_rank * hw.dies, experts_per_token, hidden, np.asarray(float(devices)),
                              q_dispatch, hw, prefill, as_placed=True)
    return float(disp if collective == "dispatch" else comb)


#: collectives :func:`collective_time` prices, and the bus-bandwidth formula of each
COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all")
#: the largest group and message it takes: a thousand times today's largest
MAX_GROUP, MAX_MESSAGE_BYTES = 100_000_000, 1e15


def collective_time(system, op: str, message_bytes: float, devices: int) -> float:
    """Seconds of one collective of ``op`` over ``devices`` consecutive devices of
    ``system`` (a name, a TOML path or a System), as snlab's planners price it:
    ``message_bytes`` is the full buffer each device holds (the all-reduce's buffer,
    the reduce-scatter's input, the all-gather's output, the all-to-all's send buffer),
    as nccl-tests counts it. A group that spans scale-up domains pays the two-level
    collective: each step's latency on its own level, the data at the slower level's pace."""
    from .errors import SnlabError
    from .grid import finite, show, unwrap, whole_number
    from .hardware import hardware
    from .presets import system as load_system
    if op not in COLLECTIVES:
        raise SnlabError("op", f"got {op!r}", ", ".join(COLLECTIVES))
    message_bytes = unwrap(message_bytes)
    if not finite(message_bytes) or not 0 < message_bytes <= MAX_MESSAGE_BYTES:
        raise SnlabError("message_bytes", f"got {show(message_bytes)}",
                         f"a number of bytes > 0 and at most {MAX_MESSAGE_BYTES:.0e}")
    devices = whole_number("devices", devices, 2, MAX_GROUP, f"a whole number of devices from 2 to {MAX_GROUP:,}")
    hw = hardware(load_system(system))
    S, n = np.asarray(float(message_bytes)), np.asarray(float(devices))
    op_fn = {"all-reduce": all_reduce, "reduce-scatter": reduce_scatter, "all-gather": reduce_scatter,
             "all-to-all": all_to_all}[op]
    return float(op_fn(S, n, 1.0, hw))


def bus_bandwidth(op: str, message_bytes: float, devices: int, time: float) -> float:
    """NCCL's bus bandwidth [bytes/s] of a collective that took ``time`` seconds: the
    algorithm bandwidth S / t times 2(n - 1)/n for all-reduce, (n - 1)/n for the others
    (nccl-tests doc/PERFORMANCE.md), comparable across group sizes with a link's bandwidth."""
    formula = cm.bus_bandwidth if op == "all-reduce" else cm.scatter_bus_bandwidth
    return float(formula(message_bytes=message_bytes, time=time, group_size=devices))
