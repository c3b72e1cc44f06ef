"""The network: where a group of devices sits on a system's levels, and what a
collective over it costs.

A system has two levels: a scale-up domain (NVLink, a PCIe switch, a supernode's bus, a
full mesh of Infinity Fabric links, a torus of ICI links) of ``scale_up_domain_size``
devices, and a scale-out network between domains. Ranks are laid out in Megatron-LM's
order (tensor innermost, then context, data with expert inside it, pipeline outermost),
so a group whose members sit ``stride`` ranks apart has ``n1`` members per domain and
spans ``n2`` domains (:func:`split`). How the scale-up level is wired decides the
collective (:mod:`snlab.walls.communication`):

* a switch: the two-level ring or tree NCCL runs, every member at the level's bandwidth;
* a full mesh (8 MI300X or MI355X): the same rings, one per link, so a group of n1 gets
  n1 - 1 of a device's links (a pair gets one of seven);
* a torus or an n-dimensional mesh (TPU pods, Trainium2, UB-Mesh): dimension-ordered
  collectives over the axes the group spans in its slice (:mod:`snlab.topology`), then
  across slices over the scale-out network.

Every function here takes a :class:`~snlab.hardware.Hardware` and broadcasts over numpy
arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .grid import maximum, minimum, where

from . import topology as topo
from .hardware import ACTIVATION_BYTES, Hardware, memo
from .walls import communication as cm
from .walls import serving as sv
from . import kernel as _kernel

_kernel.loaded(__name__)

#: the scalar types whose groups' placements and levels are kept per hardware
SCALARS = frozenset((float, int, np.float64, np.int64))
#: expert-parallel kernels -> the level field of their achieved bandwidth fraction: the
#: low-latency dispatch and combine of decode, the high-throughput ("bulk") ones of
#: prefill and training
EP_KERNELS = {"dispatch": "ep_dispatch_efficiency", "combine": "ep_combine_efficiency", "bulk": "ep_bulk_efficiency"}


def wiring(hw: Hardware) -> str:
    """How the scale-up level is wired, as the collectives see it: ``"switch"``, ``"mesh"``
    (one full mesh) or ``"axes"`` (a torus or an n-dimensional mesh)."""
    kind = getattr(hw.topology, "kind", "switch")
    return {"full-mesh": "mesh", "torus": "axes", "nd-full-mesh": "axes"}.get(kind, "switch")


def shared(bandwidth, span, oversubscription, tier_devices):
    """A switch level's bandwidth for a group spanning ``span`` devices [bytes/s]: all of
    it below the oversubscribed tier, 1/oversubscription of it above (the upper tier's
    links are shared by that many devices' traffic)."""
    if not np.any(oversubscription > 1):          # a non-blocking level (every shipped one): nothing to share
        return bandwidth
    return where((oversubscription > 1) & (span > tier_devices), bandwidth / oversubscription, bandwidth)


def inner_bandwidth(n1, stride, hw: Hardware):
    """Bandwidth per device per direction a group of n1 members ``stride`` ranks apart
    gets inside one scale-up domain [bytes/s]: the switch's (shared above an
    oversubscribed tier); on a full mesh its members' n1 - 1 mutual links; on a torus or
    n-dimensional mesh what its all-to-all achieves through the group's bisection
    (:data:`snlab.walls.communication.axis_all_to_all_time`)."""
    kind = wiring(hw)
    if kind == "switch":
        return shared(hw.scale_up_bandwidth, n1 * stride, hw.scale_up_oversubscription, hw.scale_up_tier_devices)
    axis = hw.topology.axes[0]
    if kind == "mesh":
        # (a group of one has no inner traffic: the floor only keeps the rate positive)
        return maximum(n1 - 1, 1.0) * axis.links * axis.link_bandwidth * topo.link_scale(hw)
    # (a group of one: priced as a neighbouring pair, and not used; its stride may reach past
    # the domain, where a pair would find no links)
    pair = maximum(n1, 2.0)
    g = topo.group_axes(pair, where(n1 > 1, stride, 1.0), hw)
    one = cm.axis_all_to_all_time.evaluate({**g.inputs(), **{f"axis_latency_{a}": 0.0 for a in topo.AXES},
                                             "message_bytes": 1.0, "group_size": pair, "call_latency": 0.0,
                                             "link_bandwidth": g.injection, "link_efficiency": 1.0})
    return (pair - 1) / pair / one


def outer_bandwidth(n, stride, hw: Hardware):
    """Scale-out bandwidth per device per direction of a group spanning ``n`` x ``stride``
    ranks [bytes/s] (shared above an oversubscribed tier)."""
    return shared(hw.scale_out_bandwidth, n * stride, hw.scale_out_oversubscription, hw.scale_out_tier_devices)


def link_bandwidth(hw: Hardware):
    """Bandwidth of the path between two devices of one scale-up domain per direction
    [bytes/s]: the whole device's on a switch; one peer's links on a full mesh; on a torus
    or n-dimensional mesh the slowest axis's links (a pipeline's neighbours may sit along
    any axis)."""
    if wiring(hw) == "switch":
        return hw.scale_up_bandwidth
    return min(a.links * a.link_bandwidth for a in hw.topology.axes) * topo.link_scale(hw)


def per_domain(stride, hw: Hardware):
    """Members of a group ``stride`` ranks apart that one scale-up domain can hold (at
    least one: members farther apart than a domain sit on a domain each)."""
    return maximum(np.floor(hw.scale_up_domain_size / stride), 1.0)


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
        found = _DIVISORS[n] = tuple(float(d) for d in topo.divisors(n))
    return found


def placements(n, stride, hw: Hardware):
    """:func:`group_placements`, kept per hardware for a scalar group (:func:`snlab.hardware.memo`)."""
    kept = memo(hw) if type(n) in SCALARS and type(stride) in SCALARS else None
    if kept is None:
        return group_placements(n, stride, hw)
    key = (group_placements, type(n), n, type(stride), stride)
    found = kept.get(key)
    if found is None:
        found = kept[key] = tuple(group_placements(n, stride, hw))
    return found


def group_placements(n, stride, hw: Hardware):
    """Every way a group of n members ``stride`` ranks apart may sit on the levels, as
    (fits, n1, n2) triples in increasing n1: n1 members in each of n2 = n / n1 domains,
    for every n1 that divides n; ``fits`` says, row by row, whether a domain holds n1
    members (:func:`per_domain`). The first, a member per domain, always fits. A
    scheduler may place a group on fewer devices per domain than the domain could hold,
    and a collective library may leave part of a domain to the scale-out network (NCCL
    with NCCL_MNNVL_ENABLE=0 runs a GB200 NVL72 as eighteen trays over InfiniBand): a
    two-level collective moves less over the scale-up links (each member's 1/n1 share
    crosses the NICs in parallel). A larger domain only adds placements, so pricing at
    the fastest placement means a larger domain is never slower. On a torus or an
    n-dimensional mesh the slice's layout places the group (:func:`snlab.topology.group_axes`):
    that one placement."""
    if wiring(hw) == "axes":
        inner = topo.group_axes(n, stride, hw).inner
        yield True, inner, n / inner
        return
    yield True, 1.0, n
    cap = per_domain(stride, hw)
    sizes = np.unique(np.asarray(n, dtype=float)) if np.ndim(n) else np.asarray([n], dtype=float)
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
        best = t if best is None else where(fits, minimum(best, t), best)
    return best


def inner_step_latency(n1, hw: Hardware, stride=1.0):
    """Mean latency of one ring step inside a scale-up domain [s]: a ring of n1 devices
    ``stride`` ranks apart has n1 hops; in a domain that spans several nodes
    (CloudMatrix384's 48 nodes on one bus) the k hops between the group's k nodes pay
    ``scale_up_latency`` and the others ``scale_up_node_latency`` (members
    ``devices_per_node`` or more ranks apart each sit on a node of their own). A group of
    one (a point-to-point message) pays the first."""
    per_node = maximum(minimum(n1, np.floor(hw.devices_per_node / stride)), 1.0)
    k = np.ceil(n1 / per_node)
    crossing = where(k > 1, k, 0.0)
    return where(n1 > 1, ((n1 - crossing) * hw.scale_up_node_latency + crossing * hw.scale_up_latency) / n1,
                 hw.scale_up_latency)


def levels(n1, n2, hw: Hardware, stride=1.0) -> dict:
    """:func:`group_levels`, kept per hardware for a scalar group (:func:`snlab.hardware.memo`);
    a copy, which the caller may change."""
    kept = memo(hw) if type(n1) in SCALARS and type(n2) in SCALARS and type(stride) in SCALARS else None
    if kept is None:
        return group_levels(n1, n2, hw, stride)
    key = (group_levels, type(n1), n1, type(n2), n2, type(stride), stride)
    found = kept.get(key)
    if found is None:
        found = kept[key] = group_levels(n1, n2, hw, stride)
    return dict(found)


def group_levels(n1, n2, hw: Hardware, stride=1.0) -> dict:
    """The two-level collective formulas' inputs for a group of n1 x n2 devices
    ``stride`` ranks apart: each ring step pays its own level's latency
    (:func:`inner_step_latency` inside a domain); a call spanning domains pays the larger
    of the two levels' per-call latencies."""
    spans = n2 > 1
    return dict(
        inner_size=n1, outer_size=n2,
        inner_latency=inner_step_latency(n1, hw, stride), inner_bandwidth=inner_bandwidth(n1, stride, hw),
        inner_efficiency=hw.scale_up_efficiency,
        outer_latency=hw.scale_out_latency, outer_bandwidth=outer_bandwidth(n1 * n2, stride, hw),
        outer_efficiency=hw.scale_out_efficiency,
        call_latency=where(spans, maximum(hw.scale_up_call_latency, hw.scale_out_call_latency),
                              hw.scale_up_call_latency),
    )


def sliced(op: str, S, n, stride, hw: Hardware):
    """Time of a collective over a torus or n-dimensional mesh [s]: the axis formula over
    the axes the group spans inside its slice, and across slices the scale-out level
    (:data:`snlab.walls.communication.sliced_all_reduce_time` and its siblings)."""
    g = topo.group_axes(n, stride, hw)
    spans = g.slices > 1
    inputs = dict(message_bytes=S, link_efficiency=hw.scale_up_efficiency, outer_size=g.slices,
                  outer_latency=hw.scale_out_latency, outer_bandwidth=outer_bandwidth(n, stride, hw),
                  outer_efficiency=hw.scale_out_efficiency, **g.inputs(),
                  call_latency=where(spans, maximum(hw.scale_up_call_latency, hw.scale_out_call_latency),
                                     hw.scale_up_call_latency))
    if op == "all-to-all":
        # (a group with one member per slice sends nothing inside one: any positive rate will do)
        return cm.sliced_all_to_all_time.evaluate({**inputs, "group_size": g.inner,
                                                   "link_bandwidth": where(g.injection > 0, g.injection,
                                                                           link_bandwidth(hw))})
    formula = cm.sliced_all_reduce_time if op == "all-reduce" else cm.sliced_reduce_scatter_time
    return formula.evaluate(inputs)


def all_reduce(S, n, stride, hw: Hardware):
    """Time of an all-reduce of S bytes over n devices ``stride`` ranks apart [s], at
    the fastest of the group's :func:`placements`."""
    if wiring(hw) == "axes":
        return where(n > 1, sliced("all-reduce", S, n, stride, hw), 0.0)
    t = fastest(lambda n1, n2: cm.hierarchical_all_reduce_time(message_bytes=S, **levels(n1, n2, hw, stride)), n, stride, hw)
    return where(n > 1, t, 0.0)


def reduce_scatter(S, n, stride, hw: Hardware):
    """Time of a reduce-scatter (or all-gather) of an S-byte buffer [s]."""
    if wiring(hw) == "axes":
        return where(n > 1, sliced("reduce-scatter", S, n, stride, hw), 0.0)
    t = fastest(lambda n1, n2: cm.hierarchical_reduce_scatter_time(message_bytes=S, **levels(n1, n2, hw, stride)),
                n, stride, hw)
    return where(n > 1, t, 0.0)


def all_to_all(S, n, stride, hw: Hardware):
    """Time of an all-to-all of an S-byte send buffer [s]."""
    if wiring(hw) == "axes":
        return where(n > 1, sliced("all-to-all", S, n, stride, hw), 0.0)
    t = fastest(lambda n1, n2: cm.hierarchical_all_to_all_time(message_bytes=S, **levels(n1, n2, hw, stride)), n, stride, hw)
    return where(n > 1, t, 0.0)


def one_shot_all_reduce(S, n, hw: Hardware, stride=1.0):
    """Time of a one-shot all-reduce inside one scale-up domain [s]: every member reads
    each peer's whole buffer over its links and reduces it locally
    (:data:`snlab.walls.communication.direct_all_reduce_time`), at the group's bandwidth
    (on a full mesh each peer's own link), with the engines' fixed cost where the system
    has one, else the collective library's."""
    call = where(hw.scale_up_direct_call_latency > 0, hw.scale_up_direct_call_latency, hw.scale_up_call_latency)
    return cm.direct_all_reduce_time(message_bytes=S, group_size=n, call_latency=call, latency=hw.scale_up_latency,
                                     link_bandwidth=inner_bandwidth(n, stride, hw),
                                     link_efficiency=hw.scale_up_efficiency)


def point_to_point(S, inside, hw: Hardware):
    """One message of S bytes, inside a scale-up domain or across domains [s]; inside
    a domain it takes the faster of the two paths (a device keeps its NIC), over the
    link between the two devices (:func:`link_bandwidth`)."""
    up = cm.point_to_point_time(message_bytes=S, latency=hw.scale_up_latency, link_bandwidth=link_bandwidth(hw),
                                link_efficiency=hw.scale_up_efficiency, call_latency=hw.scale_up_call_latency)
    out = cm.point_to_point_time(message_bytes=S, latency=hw.scale_out_latency,
                                 link_bandwidth=hw.scale_out_bandwidth, link_efficiency=hw.scale_out_efficiency,
                                 call_latency=hw.scale_out_call_latency)
    return where(inside, minimum(up, out), out)


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
            domains = minimum(domains, domain_cap(n2))
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
#: algorithms :func:`collective` may be asked for: the collective library's choice, or the
#: one-shot all-reduce inside one scale-up domain
ALGORITHMS = ("auto", "one-shot")
#: the largest group and message it takes: a thousand times today's largest
MAX_GROUP, MAX_MESSAGE_BYTES = 100_000_000, 1e15


def with_slice(hw: Hardware, devices, dims=None) -> Hardware:
    """``hw`` with a job's slice of ``devices`` devices on a torus or mesh: ``dims`` (axis
    lengths) or, on a pod cut by optical switches, the slice a scheduler gives that many
    (:func:`snlab.topology.auto_slice`); the slice is the job's scale-up domain. A switch
    level is returned as it is."""
    if wiring(hw) == "switch" or hw.topology.kind == "full-mesh":
        return hw
    top = hw.topology
    if dims is None:
        dims = topo.auto_slice(int(devices), top)
    x, y, z = (tuple(dims) + (1, 1))[:3]
    return _sliced(hw, float(x), float(y), float(z))


def _sliced(hw: Hardware, x, y, z) -> Hardware:
    """``hw`` on a slice of ``x`` by ``y`` by ``z`` devices, the job's scale-up domain; the
    whole domain's switches and optics (``switch_power``) stay the whole domain's, so a
    device's share of them does not grow as the slice shrinks."""
    size = x * y * z
    return hw.replace(slice_x=x, slice_y=y, slice_z=z, scale_up_domain_size=size,
                      switch_power=hw.switch_power * size / np.maximum(hw.scale_up_domain_size, 1.0))


def placed(system, hw: Hardware, devices, given=None) -> Hardware:
    """``hw`` with each row's slice on a torus: the shapes ``given`` (``(shapes, index)``:
    a list of axis lengths or None, and each row's index into it) or the scheduler's for the
    row's ``devices``; each slice is its job's scale-up domain. Other levels are returned as
    they are (a mesh's or a switch's domain is fixed)."""
    top = system.scale_up.topology
    if top.kind != "torus":
        return hw
    if np.any(np.asarray(hw.scale_up_domain_size) != top.devices):
        from .errors import SnlabError
        raise SnlabError("scale_up_domain_size", f"a torus's domain is the job's slice ({system.name})",
                         "no domain size on a torus: the plan's slice sets it (slice='4x4x8')")
    if given is None and not top.reconfigurable:
        return hw
    X, Y, Z = topo.slice_columns(top, devices, given)
    return _sliced(hw, X, Y, Z)


@dataclass(frozen=True)
class Collective:
    """One collective as snlab prices it: its time [s], NCCL's bus bandwidth [bytes/s],
    the algorithm priced, where the group sits (``placement``: members per axis or per
    domain), and the source of the link efficiency that sets its large-message pace."""

    system: str
    op: str
    message_bytes: float
    devices: int
    stride: int
    time_s: float
    bus_bandwidth: float
    algorithm: str
    topology: str
    placement: str
    efficiency_source: str

    def to_dict(self) -> dict:
        return {"system": self.system, "op": self.op, "message_bytes": self.message_bytes, "devices": self.devices,
                "stride": self.stride, "time_s": self.time_s,
                "algorithm_bandwidth_bytes_per_s": self.message_bytes / self.time_s,
                "bus_bandwidth_bytes_per_s": self.bus_bandwidth, "algorithm": self.algorithm,
                "topology": self.topology, "placement": self.placement, "efficiency_source": self.efficiency_source}


def collective(system, op: str, message_bytes: float, devices: int, *, stride: int = 1, slice: str | None = None,
               algorithm: str = "auto") -> Collective:
    """One collective of ``op`` over ``devices`` devices ``stride`` ranks apart of
    ``system`` (a name, a TOML path or a System), as snlab's planners price it, with the
    algorithm it priced. ``message_bytes`` is the full buffer each device holds (the
    all-reduce's buffer, the reduce-scatter's input, the all-gather's output, the
    all-to-all's send buffer), as nccl-tests counts it. On a pod cut by optical switches
    ``slice`` ("4x4x8") is the job's slice (default: the one a scheduler gives
    ``devices x stride`` chips). ``algorithm="one-shot"`` asks for the one-shot
    all-reduce inside one scale-up domain."""
    from .errors import SnlabError
    from .grid import finite, show, unwrap, whole_number
    from .hardware import hardware
    from .presets import system as load_system
    if op not in COLLECTIVES:
        raise SnlabError("op", f"got {op!r}", ", ".join(COLLECTIVES))
    if algorithm not in ALGORITHMS:
        raise SnlabError("algorithm", f"got {algorithm!r}", ", ".join(ALGORITHMS))
    message_bytes = unwrap(message_bytes)
    if not finite(message_bytes) or not 0 < message_bytes <= MAX_MESSAGE_BYTES:
        raise SnlabError("message_bytes", f"got {show(message_bytes)}",
                         f"a number of bytes > 0 and at most {MAX_MESSAGE_BYTES:.0e}")
    devices = whole_number("devices", devices, 2, MAX_GROUP, f"a whole number of devices from 2 to {MAX_GROUP:,}")
    stride = whole_number("stride", stride, 1, MAX_GROUP, f"a whole number of ranks from 1 to {MAX_GROUP:,}")
    s = load_system(system)
    hw = hardware(s)
    top = s.scale_up.topology
    dims = None
    if slice is not None:
        if top.kind != "torus":
            raise SnlabError("slice", f"{s.name} is a {top.describe()}", "no slice: only a torus takes one")
        dims = topo.parse_slice(slice, top)
        topo.check_slice(dims, int(devices) * int(stride))     # one slice, or several equal ones
    hw = with_slice(hw, devices * stride, dims)
    S, n, k = np.asarray(float(message_bytes)), np.asarray(float(devices)), np.asarray(float(stride))
    if algorithm == "one-shot":
        if op != "all-reduce" or devices * stride > hw.scale_up_domain_size or wiring(hw) == "axes":
            raise SnlabError("algorithm", f"one-shot for the {op} over {devices} devices of {s.name}",
                             "auto; one-shot is an all-reduce inside one switch or full-mesh domain")
        t = float(one_shot_all_reduce(S, n, hw, k))
    else:
        op_fn = {"all-reduce": all_reduce, "reduce-scatter": reduce_scatter, "all-gather": reduce_scatter,
                 "all-to-all": all_to_all}[op]
        t = float(op_fn(S, n, k, hw))
    name, where_ = describe(op, S, n, k, hw, algorithm)
    prov = s.provenance.get("scale_up.efficiency")
    source = f"{prov.source}, {prov.where}".strip(", ") if prov is not None else ""
    return Collective(system=s.name, op=op, message_bytes=float(message_bytes), devices=devices, stride=stride,
                      time_s=t, bus_bandwidth=bus_bandwidth(op, float(message_bytes), devices, t), algorithm=name,
                      topology=top.describe(), placement=where_, efficiency_source=source)


def collective_frame(systems, op: str, devices, message_bytes: float):
    """One row per system and group size: the collective's time [s], NCCL's bus bandwidth
    [GB/s], the algorithm priced and where the group sits (:func:`collective`): a pandas
    DataFrame for the side-by-side charts of switches, meshes and tori."""
    import pandas as pd
    rows = []
    for system in systems:
        for n in devices:
            c = collective(system, op, message_bytes, n)
            rows.append({"system": c.system, "devices": int(n), "time_s": c.time_s,
                         "bus_bandwidth_gbs": c.bus_bandwidth / 1e9, "algorithm": c.algorithm,
                         "placement": c.placement, "topology": c.topology})
    return pd.DataFrame(rows)


def describe(op: str, S, n, stride, hw: Hardware, algorithm: str = "auto") -> tuple[str, str]:
    """The algorithm a collective is priced with, and where its group sits, in words."""
    kind = wiring(hw)
    if kind == "axes":
        g = topo.group_axes(n, stride, hw)
        shape = "x".join(f"{float(k):g}" for k in g.size if float(k) > 1) or "1"
        rings = []
        for a, k, w in zip(topo.AXES, g.size, g.paths):
            if float(k) > 1:
                kind_ = hw.topology.axes[topo.AXES.index(a)].kind if topo.AXES.index(a) < len(hw.topology.axes) else "line"
                rings.append(f"{a}: {float(k):g} " + ({"mesh": "full mesh", "switch": "switch"}.get(kind_)
                                                       or ("ring" if float(w) > 1 else "line")))
        what = {"all-to-all": "dimension-ordered all-to-all, bounded by each axis's bisection"}.get(
            op, "dimension-ordered bidirectional rings, one chunk per axis, all axes at once")
        across = f", then across {float(g.slices):g} slices over the scale-out network" if float(g.slices) > 1 else ""
        return what + across, f"{shape} in the slice ({', '.join(rings)})"
    formula = {"all-to-all": cm.hierarchical_all_to_all_time, "all-reduce": cm.hierarchical_all_reduce_time}.get(
        op, cm.hierarchical_reduce_scatter_time)
    # the placement the collective is priced at: the fastest that fits (:func:`fastest`)
    n1, n2 = min(((float(n1), float(n2)) for fits, n1, n2 in placements(n, stride, hw) if bool(fits)),
                 key=lambda p: float(formula(message_bytes=S, **levels(np.float64(p[0]), np.float64(p[1]), hw,
                                                                       stride))))
    where_ = f"{n1:g} per scale-up domain x {n2:g} domain{'s' if n2 > 1 else ''}"
    links = "over the full mesh, one ring per link (n - 1 links of each device)" if kind == "mesh" else \
        "through the switch"
    if algorithm == "one-shot":
        return "one-shot all-reduce: each device reads every peer's buffer " + \
            ("over its own link to that peer" if kind == "mesh" else "through the switch"), where_
    if op == "all-to-all":
        return "pairwise exchange " + ("over each peer's own link" if kind == "mesh" else "through the switch") + \
            (", both levels at once" if n2 > 1 else ""), where_
    if n2 == 1:
        return f"ring {links}", where_
    if op == "all-reduce":      # the tree's fill (log2 n2 steps across) is never longer than the ring's
        return f"ring inside each domain ({links}), double binary tree across domains", where_
    return f"one ring through every domain ({links} inside)", where_


def collective_time(system, op: str, message_bytes: float, devices: int, *, stride: int = 1,
                    slice: str | None = None, algorithm: str = "auto") -> float:
    """Seconds of one collective (:func:`collective`, which also says which algorithm it
    priced). A group that spans scale-up domains pays the two-level collective: each
    step's latency on its own level, the data at the slower level's pace."""
    return collective(system, op, message_bytes, devices, stride=stride, slice=slice, algorithm=algorithm).time_s


def bus_bandwidth(op: str, message_bytes: float, devices: int, time: float) -> float:
    """NCCL's bus bandwidth [bytes/s] of a collective that took ``time`` seconds: the
    algorithm bandwidth S / t times 2(n - 1)/n for all-reduce, (n - 1)/n for the others
    (nccl-tests doc/PERFORMANCE.md), comparable across group sizes with a link's bandwidth."""
    formula = cm.bus_bandwidth if op == "all-reduce" else cm.scatter_bus_bandwidth
    return float(formula(message_bytes=message_bytes, time=time, group_size=devices))
