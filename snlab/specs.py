"""Frozen descriptions of hardware and models, as loaded from presets.

Every quantity is a float in SI base units (bytes, seconds, bytes/s, FLOP/s).
Link bandwidths are per device, per direction; peak compute is dense. Each object
keeps, in ``provenance``, the value as written in its preset with unit, source and
convention, keyed by ``"section.field"``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterator, Mapping

from . import schema
from .errors import SnlabError
from .units import fmt_bytes, fmt_seconds
from . import kernel as _kernel

_kernel.loaded(__name__)


@dataclass(frozen=True)
class Provenance:
    """Where a preset number came from and how it was written."""

    value: float
    unit: str
    source: str
    where: str = ""
    convention: str = ""
    note: str = ""


_EMPTY: Mapping[str, Provenance] = MappingProxyType({})


class FrozenMap(Mapping):
    """A read-only mapping that can be hashed (so presets can key caches)."""

    __slots__ = ("_items", "_hash")

    def __init__(self, items: Mapping | None = None):
        self._items = dict(items or {})
        self._hash = hash(tuple(sorted(self._items.items())))

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self) -> Iterator:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"


def _cite(prov: Mapping[str, Provenance], key: str) -> str:
    p = prov.get(key)
    if p is None:
        return ""
    return p.source + (f", {p.where}" if p.where else "")


# --- hardware -----------------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    """One accelerator: dense peak compute per precision, HBM, calibration constants.

    Attributes
    ----------
    peak_flops : mapping of precision (``"bf16"``, ``"fp8"``, ...) to dense FLOP/s.
    hbm_capacity : bytes. hbm_bandwidth : bytes/s.
    gemm_efficiency : achievable fraction of peak for large matrix multiplies.
    memory_efficiency : achievable fraction of HBM bandwidth.
    sustained_clock : sustained/boost clock ratio (1 = no throttling).
    dies : dies of the package that software drives as separate devices (ranks), each
        with its share of the compute, memory and links (Ascend 910C: 2; 1 for packages
        that present as one device, B200 included). The serving model runs such dies as
        data-parallel ranks when a deployment has no tensor parallelism.
    decode_attention_efficiency : achievable fraction of peak of the decode attention
        kernel when it is compute-bound (FlashMLA-style); 0 means "use gemm_efficiency".
    memory_reserve : bytes the device holds before a job allocates (driver carve-out,
        runtime context, communication buffers).
    allocator_efficiency : fraction of the rest the caching allocator can hand out.
    overlap_contention : compute time lost per second of communication hidden behind it.
    gemm_efficiency_fp8, gemm_efficiency_fp4 : achievable fraction of the FP8 (FP4)
        peak for large matrix multiplies; 0 means "use gemm_efficiency".
    kernel_floor : seconds one kernel takes beyond its roofline when a step's kernels
        are replayed from a captured graph (CUDA graphs, an NPU's graph mode): launch
        inside the graph, prologue and tail; 0 means none.
    decode_attention_floor : the same for one decode-attention call over a paged KV cache.
    launch_overhead : host seconds to launch one kernel without a captured graph (the
        kernel cannot start sooner); 0 means the same as kernel_floor.
    gemm_half_elements, gemm_half_elements_fp8, gemm_half_elements_fp4 : output
        elements (M x N) at which a GEMM in 16 bits (FP8, FP4) runs at half its
        large-GEMM rate (:data:`snlab.walls.compute.gemm_occupancy`); 0 means no such
        limit is measured (int8 takes FP8's, fp16 BF16's).
    flash_attention_efficiency : achievable fraction of the 16-bit peak of the fused
        attention kernel in training; 0 means "as a 16-bit matrix multiply".
    family : the chip the device is built around ("A100", "H100", ...): published runs
        on one member of a family say how far to trust predictions for the others.
    tdp [W] : the device's power limit (board or package TDP); 0 means the preset has no
        power model. idle_power [W] : its draw with a model resident and no kernel running.
    hbm_energy [J/byte] : energy per byte streamed from or to HBM above idle (on-chip
        movement included). link_energy [J/byte] : the same per byte sent over the
        scale-up links (:data:`snlab.walls.power.device_power`).
    """

    name: str
    description: str
    vendor: str
    peak_flops: Mapping[str, float]
    hbm_capacity: float
    hbm_bandwidth: float
    gemm_efficiency: float
    memory_efficiency: float
    sustained_clock: float = 1.0
    dies: int = 1
    decode_attention_efficiency: float = 0.0
    memory_reserve: float = 0.0
    allocator_efficiency: float = 1.0
    overlap_contention: float = 0.0
    gemm_efficiency_fp8: float = 0.0
    flash_attention_efficiency: float = 0.0
    gemm_efficiency_fp4: float = 0.0
    kernel_floor: float = 0.0
    decode_attention_floor: float = 0.0
    launch_overhead: float = 0.0
    gemm_half_elements: float = 0.0
    gemm_half_elements_fp8: float = 0.0
    gemm_half_elements_fp4: float = 0.0
    family: str = ""
    provenance: Mapping[str, Provenance] = field(default_factory=lambda: _EMPTY, compare=False, repr=False)
    tdp: float = 0.0
    idle_power: float = 0.0
    hbm_energy: float = 0.0
    link_energy: float = 0.0

    kind = "device"

    def __post_init__(self):
        if not isinstance(self.peak_flops, FrozenMap):
            if not isinstance(self.peak_flops, Mapping):
                raise SnlabError(f"{self.name}.peak_flops", f"got {self.peak_flops!r}",
                                 "a mapping of precision to dense FLOP/s")
            object.__setattr__(self, "peak_flops", FrozenMap(self.peak_flops))

    def peak(self, precision: str = "bf16") -> float:
        """Dense peak FLOP/s at ``precision``; error listing the supported ones."""
        try:
            return self.peak_flops[precision]
        except KeyError:
            raise SnlabError(f"{self.name}.precision", f"{precision!r} not supported",
                             ", ".join(self.peak_flops)) from None

    def replace(self, **changes) -> "Device":
        return _replace(self, changes)

    def gemm_half_elements_at(self, precision: str) -> float:
        """Output elements at which a GEMM at ``precision`` runs at half its large-GEMM rate."""
        return {"fp8": self.gemm_half_elements_fp8, "int8": self.gemm_half_elements_fp8,
                "fp4": self.gemm_half_elements_fp4}.get(precision, self.gemm_half_elements)

    def gemm_efficiency_at(self, precision: str) -> float:
        """Achievable fraction of the peak at ``precision`` for large matrix multiplies."""
        own = {"fp8": self.gemm_efficiency_fp8, "fp4": self.gemm_efficiency_fp4}.get(precision, 0.0)
        return own or self.gemm_efficiency

    @property
    def usable_memory(self) -> float:
        """Bytes a job can allocate (:data:`snlab.walls.memory.usable_memory`)."""
        from .walls import memory as mw     # sympy loads on first use, not on import snlab
        return float(mw.usable_memory(capacity=self.hbm_capacity, memory_reserve=self.memory_reserve,
                                      allocator_efficiency=self.allocator_efficiency))

    def _repr_html_(self) -> str:
        rows = [(f"peak {k}", f"{v / 1e12:.4g} TFLOP/s (dense)", _cite(self.provenance, f"compute.{k}"))
                for k, v in self.peak_flops.items()]
        rows += [
            ("HBM", fmt_bytes(self.hbm_capacity), _cite(self.provenance, "memory.hbm_capacity")),
            ("HBM bandwidth", f"{self.hbm_bandwidth / 1e12:.4g} TB/s", _cite(self.provenance, "memory.hbm_bandwidth")),
            ("GEMM efficiency", f"{self.gemm_efficiency:.2f}", _cite(self.provenance, "calibration.gemm_efficiency")),
            ("memory efficiency", f"{self.memory_efficiency:.2f}", _cite(self.provenance, "calibration.memory_efficiency")),
            ("sustained clock", f"{self.sustained_clock:.2f}", _cite(self.provenance, "calibration.sustained_clock")),
        ]
        if self.tdp:
            rows += [("power limit (TDP)", f"{self.tdp:.4g} W", _cite(self.provenance, "power.tdp")),
                     ("idle power", f"{self.idle_power:.4g} W", _cite(self.provenance, "power.idle_power")),
                     ("HBM energy", f"{self.hbm_energy * 1e12:.3g} pJ/B", _cite(self.provenance, "power.hbm_energy"))]
        return _html_table(f"device {self.name}: {self.description}", rows)


#: how a level may be built: one switched fabric (NVSwitch, a Clos of UB or Ethernet
#: switches), a full mesh of point-to-point links (8 GPUs on Infinity Fabric), a k-ary
#: n-cube torus (TPU ICI, Trainium NeuronLink) or an n-dimensional full mesh (UB-Mesh)
TOPOLOGY_KINDS = ("switch", "full-mesh", "torus", "nd-full-mesh")
#: what one axis of a torus or mesh is: a ring (wrap-around links), a line (none), a
#: full mesh (every pair of members linked), or a switch joining the meshes below it
AXIS_KINDS = ("ring", "line", "mesh", "switch")
#: the most axes a torus or mesh may have (the collective formulas have three)
MAX_AXES = 3


@dataclass(frozen=True)
class Axis:
    """One axis of a torus or mesh: ``kind`` (:data:`AXIS_KINDS`), ``size`` devices
    along it (for a torus whose slices are cut by optical switches, the longest slice),
    ``link_bandwidth`` [bytes/s] of one link per direction, and ``links`` between each
    pair of neighbours (ring, line) or of peers (mesh); a switch axis has one link per
    device into the switch."""

    kind: str
    size: int
    link_bandwidth: float
    links: int = 1

    @property
    def device_bandwidth(self) -> float:
        """What one device sends along this axis per direction [bytes/s], over all its links."""
        if self.kind == "mesh":
            return (self.size - 1) * self.links * self.link_bandwidth
        if self.kind == "switch":
            return self.link_bandwidth
        neighbours = 0 if self.size < 2 else (1 if self.size == 2 else 2)
        return neighbours * self.links * self.link_bandwidth


@dataclass(frozen=True)
class Topology:
    """How a level's devices are wired.

    ``kind`` is one of :data:`TOPOLOGY_KINDS`. A switch has ``tiers`` of switches and an
    ``oversubscription`` (a group spanning more than ``tier_devices`` devices shares the
    upper tiers' links: it gets 1/oversubscription of its bandwidth). A full mesh, torus or
    n-dimensional mesh has ``axes`` (:class:`Axis`), innermost first; ranks fill them in
    that order. A torus whose slices optical switches cut (TPU pods) has
    ``wrap_multiple`` > 0: a slice gets wrap-around links along an axis whose length is a
    multiple of it (a fixed torus: 0, each ring axis has them).
    """

    kind: str = "switch"
    axes: tuple = ()
    tiers: int = 1
    oversubscription: float = 1.0
    tier_devices: int = 0
    wrap_multiple: int = 0

    @property
    def devices(self) -> int:
        """Devices the axes hold (0 for a switch, whose level gives its domain size)."""
        out = 1
        for axis in self.axes:
            out *= axis.size
        return out if self.axes else 0

    @property
    def device_bandwidth(self) -> float:
        """What one device sends over all its links per direction [bytes/s] (0 for a switch)."""
        return sum(axis.device_bandwidth for axis in self.axes)

    @property
    def reconfigurable(self) -> bool:
        """Whether a job's slice takes its shape from optical switches (TPU pods)."""
        return self.wrap_multiple > 0

    def describe(self) -> str:
        """The topology in a few words: 'torus 16x16x24 (wrap-around on multiples of 4)'."""
        if self.kind == "switch":
            over = f", {self.oversubscription:g}:1 above {self.tier_devices} devices" if self.oversubscription > 1 else ""
            return f"switch, {self.tiers} tier{'s' if self.tiers > 1 else ''}{over}"
        shape = "x".join(str(a.size) for a in self.axes)
        kinds = "/".join(dict.fromkeys(a.kind for a in self.axes))
        wrap = f", wrap-around on slices of multiples of {self.wrap_multiple}" if self.wrap_multiple else ""
        return f"{self.kind} {shape} ({kinds}{wrap})"


SWITCH = Topology()


@dataclass(frozen=True)
class Level:
    """A level of the network: scale-up domain or scale-out fabric.

    bandwidth [bytes/s] per device, per direction; latency [s] per message or
    collective step, software included; efficiency: achievable fraction of bandwidth
    in collectives; domain_size: devices in one domain (scale-up only);
    call_latency [s]: fixed cost of one collective call (launch, synchronisation).
    direct_call_latency [s]: fixed cost of one one-shot all-reduce by the inference
    engines' own kernels (every device reads its peers' buffers over the scale-up
    links; vLLM's, SGLang's and TensorRT-LLM's custom all-reduce); 0 means the level
    has none and small all-reduces take the collective library's.
    node_latency [s]: per-step latency between devices of the same node when the
    domain spans several nodes (0: the same as latency).
    ep_dispatch_efficiency, ep_combine_efficiency: achievable fraction of bandwidth of
    the expert-parallel dispatch and combine kernels at decode sizes (low-latency
    kernels, a few hundred tokens per device); ep_bulk_efficiency: the same for the
    high-throughput kernels of prefill. 0 means "use efficiency".
    topology: how the level is wired (:class:`Topology`; a switch unless the preset says).
    """

    technology: str
    bandwidth: float
    latency: float
    efficiency: float
    domain_size: int = 0
    call_latency: float = 0.0
    node_latency: float = 0.0
    direct_call_latency: float = 0.0
    ep_dispatch_efficiency: float = 0.0
    ep_combine_efficiency: float = 0.0
    ep_bulk_efficiency: float = 0.0
    topology: Topology = SWITCH


@dataclass(frozen=True)
class HostLink:
    """Device-to-host link for offload: bandwidth [bytes/s] per device per direction,
    latency [s], capacity [bytes] of host memory per device, and memory_bandwidth
    [bytes/s]: the host DRAM's peak bandwidth per device (a CPU optimizer step's pace)."""

    technology: str
    bandwidth: float
    latency: float
    capacity: float
    memory_bandwidth: float = 0.0


@dataclass(frozen=True)
class MemoryPool:
    """Memory a device reaches over the scale-up bus beyond its own HBM (supernodes):
    capacity [bytes] per domain, bandwidth [bytes/s] per device per direction, latency [s]."""

    technology: str
    capacity: float
    bandwidth: float
    latency: float


@dataclass(frozen=True)
class Storage:
    """Local SSD per device: bandwidth [bytes/s], latency [s], capacity [bytes]."""

    technology: str
    bandwidth: float
    latency: float
    capacity: float


@dataclass(frozen=True)
class SystemPower:
    """Power beyond the devices [W]: ``host_power`` per node (CPUs, memory, NICs, fans,
    power conversion), ``switch_power`` per scale-up domain (its switches and optics),
    ``network_power`` per device (scale-out ports, optics, a share of the switches); and
    the racks: ``devices_per_rack`` as built, ``network_racks`` of switches per scale-up
    domain, and ``rack_split``: whether a rack may hold fewer nodes when its cooling
    cannot take a full one (True for separate servers; False where the scale-up wiring
    fixes the rack, as in a supernode)."""

    host_power: float
    switch_power: float
    network_power: float
    devices_per_rack: int
    network_racks: int = 0
    rack_split: bool = True


@dataclass(frozen=True)
class Cooling:
    """One kind of cooling (``"air"`` or ``"liquid"``): the facility's ``pue``, the
    ``rack_power_limit`` [W] a rack may draw under it, and the ``sustained_clock``
    measured under it (0: follows from the rack limit, :data:`snlab.walls.power.thermal_clock`)."""

    kind: str
    pue: float
    rack_power_limit: float
    sustained_clock: float = 0.0


@dataclass(frozen=True)
class System:
    """Devices, how they are wired, the memory they can reach, and (when the preset has
    them) their power beyond the devices and the kinds of cooling they can run under:
    ``cooling`` maps each kind to its :class:`Cooling`, ``cooling_kind`` names the one the
    system is built for."""

    name: str
    description: str
    device: Device
    devices_per_node: int
    scale_up: Level
    scale_out: Level
    host: HostLink
    pool: MemoryPool | None = None
    storage: Storage | None = None
    max_devices: int | None = None
    provenance: Mapping[str, Provenance] = field(default_factory=lambda: _EMPTY, compare=False, repr=False)
    power: SystemPower | None = None
    cooling: Mapping[str, Cooling] = field(default_factory=lambda: FrozenMap())
    cooling_kind: str = ""

    kind = "system"

    def __post_init__(self):
        if not isinstance(self.cooling, FrozenMap):
            object.__setattr__(self, "cooling", FrozenMap(self.cooling))

    @property
    def has_power(self) -> bool:
        """Whether the preset carries a power model (device and system power)."""
        return bool(self.device.tdp) and self.power is not None and bool(self.cooling)

    @property
    def domain_size(self) -> int:
        """Devices in one scale-up domain."""
        return self.scale_up.domain_size

    def replace(self, **changes) -> "System":
        """A copy with fields changed; ``scale_up_bandwidth=...`` style keys reach
        into the levels (``scale_up``, ``scale_out``, ``host``, ``pool``)."""
        nested: dict[str, dict] = {}
        flat = {}
        for key, value in changes.items():
            for part in ("scale_up", "scale_out", "host", "pool", "storage", "power"):
                if key.startswith(part + "_") and key not in ("scale_up", "scale_out"):
                    nested.setdefault(part, {})[key[len(part) + 1:]] = value
                    break
            else:
                flat[key] = value
        for part, sub in nested.items():
            current = getattr(self, part)
            if current is None:
                raise SnlabError(f"{self.name}.{part}", "this system has none", "systems with a " + part)
            flat[part] = _replace(current, sub, check=False)
        return _replace(self, flat)

    def _repr_html_(self) -> str:
        def lvl(name, l):
            return (name, f"{l.technology}: {l.bandwidth / 1e9:.4g} GB/s per device per direction, "
                    f"{fmt_seconds(l.latency)}, efficiency {l.efficiency:.2f}"
                    + (f", domain of {l.domain_size}" if l.domain_size else "")
                    + f"; {l.topology.describe()}",
                    _cite(self.provenance, f"{name}.bandwidth"))
        rows = [("device", self.device.name, ""), lvl("scale_up", self.scale_up),
                lvl("scale_out", self.scale_out),
                ("host", f"{self.host.technology}: {self.host.bandwidth / 1e9:.4g} GB/s, "
                 f"{fmt_bytes(self.host.capacity)} per device", _cite(self.provenance, "host.bandwidth"))]
        if self.pool:
            rows.append(("pool", f"{self.pool.technology}: {fmt_bytes(self.pool.capacity)}, "
                         f"{self.pool.bandwidth / 1e9:.4g} GB/s, {fmt_seconds(self.pool.latency)}",
                         _cite(self.provenance, "pool.capacity")))
        if self.power is not None:
            p = self.power
            rows.append(("power beyond the devices", f"{p.host_power:,.0f} W per node, {p.switch_power:,.0f} W of "
                         f"scale-up switches per domain, {p.network_power:,.0f} W of network per device; "
                         f"{p.devices_per_rack} devices a rack", _cite(self.provenance, "power.host_power")))
        for kind, cool in self.cooling.items():
            rows.append((f"{kind} cooling" + (" (as built)" if kind == self.cooling_kind else ""),
                         f"PUE {cool.pue:.2f}, racks of up to {cool.rack_power_limit / 1e3:,.3g} kW",
                         _cite(self.provenance, f"cooling.{kind}.rack_power_limit")))
        return _html_table(f"system {self.name}: {self.description}", rows)


# --- models -------------------------------------------------------------------------

@dataclass(frozen=True)
class MoE:
    """Mixture-of-experts layers."""

    experts: int
    experts_per_token: int
    expert_ffn_hidden_size: int
    shared_experts: int = 0
    dense_layers: int = 0
    load_imbalance: float = 1.0
    expert_groups: int = 0
    groups_per_token: int = 0


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer's shape."""

    name: str
    description: str
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    seq_len: int
    gated_mlp: bool = False
    biases: bool = False
    norm: str = "rmsnorm"
    tied_embeddings: bool = False
    learned_positions: bool = False
    dropout: bool = False
    moe: MoE | None = None
    mla: MLA | None = None
    mtp_modules: int = 0
    provenance: Mapping[str, Provenance] = field(default_factory=lambda: _EMPTY, compare=False, repr=False)

    kind = "model"

    def symbol_values(self) -> dict[str, float]:
        """The model's shape as nomenclature values, for the wall formulas."""
        moe, mla = self.moe, self.mla
        values = dict(
            layers=self.layers, hidden_size=self.hidden_size, heads=self.heads,
            kv_heads=self.kv_heads, head_dim=self.head_dim,
            ffn_hidden_size=self.ffn_hidden_size, vocab_size=self.vocab_size,
            seq_len=self.seq_len, mlp_matrices=3 if self.gated_mlp else 2,
            bias=int(self.biases), norm_params=2 if self.norm == "layernorm" else 1,
            embedding_copies=1 if self.tied_embeddings else 2,
            learned_positions=int(self.learned_positions),
            dropout=int(self.dropout),
            dense_layers=moe.dense_layers if moe else self.layers,
            experts=moe.experts if moe else 0,
            experts_per_token=moe.experts_per_token if moe else 0,
            shared_experts=moe.shared_experts if moe else 0,
            expert_ffn_hidden_size=moe.expert_ffn_hidden_size if moe else 0,
        )
        if mla:
            values.update(q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank,
                          qk_nope_head_dim=mla.qk_nope_head_dim,
                          qk_rope_head_dim=mla.qk_rope_head_dim, v_head_dim=mla.v_head_dim)
        return values

    @property
    def params(self) -> float:
        """Total parameters (see ``snlab.sizing.params``)."""
        from .sizing import params
        return float(params(self))

    @property
    def active_params(self) -> float:
        """Parameters used per token."""
        from .sizing import active_params
        return float(active_params(self))

    def replace(self, **changes) -> "Model":
        return _replace(self, changes)

    def _repr_html_(self) -> str:
        rows = [("parameters", f"{self.params / 1e9:.4g} B", "computed")]
        if self.moe:
            rows.append(("active parameters", f"{self.active_params / 1e9:.4g} B", "computed"))
        for f_ in ("layers", "hidden_size", "heads", "kv_heads", "head_dim", "ffn_hidden_size",
                   "vocab_size", "seq_len"):
            rows.append((f_, f"{getattr(self, f_):,}", _cite(self.provenance, f_)))
        return _html_table(f"model {self.name}: {self.description}", rows)


def _replace(obj, changes: dict, check: bool = True):
    names = {f.name for f in dataclasses.fields(obj)} - {"provenance"}
    bad = [k for k in changes if k not in names]
    if bad:
        raise SnlabError(f"{type(obj).__name__.lower()}.{bad[0]}", "no such field",
                         ", ".join(sorted(names)))
    prov = dict(getattr(obj, "provenance", _EMPTY))
    for key, value in changes.items():
        for pk in [pk for pk in prov if pk == key or pk.endswith("." + key)]:
            prov[pk] = Provenance(value, schema.si_unit(pk), "changed by the user")
    new = dataclasses.replace(obj, **changes)
    if hasattr(obj, "provenance"):
        object.__setattr__(new, "provenance", MappingProxyType(prov))
    if check:
        validate(new)
    return new


def validate(obj) -> None:
    """Check every field of a device, system or model against its range in
    :mod:`snlab.schema`, and the relations between fields that single-field checks
    cannot see. Raises :class:`SnlabError` naming the field."""
    name = getattr(obj, "name", "?")
    if isinstance(obj, Model):
        _validate_model(obj, name)
    elif isinstance(obj, System):
        _validate_system(obj, name)
    elif isinstance(obj, Device):
        _validate_device(obj, name)
    elif isinstance(obj, Level):
        _validate_level(obj, name)


def _validate_model(obj: "Model", name: str) -> None:
    for f in ("layers", "hidden_size", "heads", "kv_heads", "head_dim", "ffn_hidden_size", "vocab_size", "seq_len"):
        schema.check_range(getattr(obj, f), "count", f"{name}.{f}")
    schema.check_range(obj.mtp_modules, "count0", f"{name}.mtp_modules")
    if obj.heads % obj.kv_heads:
        raise SnlabError(f"{name}.kv_heads", f"{obj.kv_heads} does not divide heads = {obj.heads}",
                         f"a divisor of {obj.heads}")
    for part in ("moe", "mla"):
        sub = getattr(obj, part)
        for f, dimension, _ in schema.MODEL[part] if sub is not None else ():
            schema.check_range(getattr(sub, f), dimension, f"{name}.{part}.{f}")
    if obj.moe:
        if obj.moe.experts_per_token > obj.moe.experts:
            raise SnlabError(f"{name}.moe.experts_per_token", f"{obj.moe.experts_per_token} > experts",
                             f"1 to {obj.moe.experts}")
        if obj.moe.dense_layers > obj.layers:
            raise SnlabError(f"{name}.moe.dense_layers", f"{obj.moe.dense_layers} > layers", f"0 to {obj.layers}")
        groups, limit = obj.moe.expert_groups, obj.moe.groups_per_token
        if groups and (obj.moe.experts % groups or not 1 <= limit <= groups):
            raise SnlabError(f"{name}.moe.expert_groups", f"{groups} groups, {limit} per token",
                             "a divisor of the experts, with groups_per_token from 1 to expert_groups")
        if not groups and limit:
            raise SnlabError(f"{name}.moe.groups_per_token", f"got {limit} without expert_groups",
                             "0 unless expert_groups is set")


def _validate_level(lvl: "Level", name: str) -> None:
    schema.check_range(lvl.bandwidth, "bytes/s", f"{name}.bandwidth")
    schema.check_range(lvl.latency, "s", f"{name}.latency")
    schema.check_range(lvl.efficiency, "1", f"{name}.efficiency")
    schema.check_range(lvl.call_latency, "s", f"{name}.call_latency")
    schema.check_range(lvl.direct_call_latency, "s", f"{name}.direct_call_latency")
    if lvl.domain_size:
        schema.check_range(lvl.domain_size, "count", f"{name}.domain_size")
    for f in ("ep_dispatch_efficiency", "ep_combine_efficiency", "ep_bulk_efficiency"):
        if getattr(lvl, f):   # 0: not set, the level's efficiency applies
            schema.check_range(getattr(lvl, f), "1", f"{name}.{f}")


def _validate_topology(lvl: "Level", name: str, domain: int | None) -> None:
    """A level's topology: known kinds, axes that hold the domain, links that carry the
    level's bandwidth. ``domain`` is the scale-up domain size (None for scale-out)."""
    top, where = lvl.topology, f"{name}.topology"
    if not isinstance(top, Topology):
        raise SnlabError(where, f"got {top!r}", "a Topology")
    if top.kind not in TOPOLOGY_KINDS:
        raise SnlabError(f"{where}.kind", f"got {top.kind!r}", ", ".join(TOPOLOGY_KINDS))
    schema.check_range(top.tiers, "count", f"{where}.tiers")
    if top.tiers > 4:
        raise SnlabError(f"{where}.tiers", f"got {top.tiers}", "1 to 4 tiers of switches")
    schema.check_range(top.oversubscription, "factor", f"{where}.oversubscription")
    schema.check_range(top.tier_devices, "count0", f"{where}.tier_devices")
    schema.check_range(top.wrap_multiple, "count0", f"{where}.wrap_multiple")
    if top.kind == "switch":
        if top.axes:
            raise SnlabError(f"{where}.dims", "a switch has no axes", "kind = torus, full-mesh or nd-full-mesh")
        if top.oversubscription > 1 and (top.tiers < 2 or top.tier_devices < 2):
            raise SnlabError(f"{where}.oversubscription", f"{top.oversubscription:g}:1 with {top.tiers} tier(s) "
                             f"and tier_devices = {top.tier_devices}",
                             "1 for one tier; above 1 only with tiers >= 2 and tier_devices >= 2 (the devices "
                             "below the oversubscribed tier)")
        return
    if domain is None:
        raise SnlabError(f"{where}.kind", f"got {top.kind!r} for the scale-out level",
                         "switch: a scale-out level joins domains through switches")
    if not 1 <= len(top.axes) <= MAX_AXES:
        raise SnlabError(f"{where}.dims", f"{len(top.axes)} axes", f"1 to {MAX_AXES} axes")
    for i, axis in enumerate(top.axes):
        label = f"{where}.dims[{i}]"
        if not isinstance(axis, Axis) or axis.kind not in AXIS_KINDS:
            raise SnlabError(label, f"got {axis!r}", "an Axis of kind " + ", ".join(AXIS_KINDS))
        schema.check_range(axis.size, "count", label)
        if axis.size < 2:
            raise SnlabError(label, f"got {axis.size}", "a whole number of devices from 2 (an axis of 1 is no axis)")
        schema.check_range(axis.link_bandwidth, "bytes/s", f"{where}.link_bandwidth[{i}]")
        schema.check_range(axis.links, "count", f"{where}.links[{i}]")
        allowed = {"full-mesh": ("mesh",), "torus": ("ring", "line"), "nd-full-mesh": ("mesh", "switch")}[top.kind]
        if axis.kind not in allowed:
            raise SnlabError(label, f"a {axis.kind} axis in a {top.kind}", "axes of kind " + ", ".join(allowed))
    if top.kind == "full-mesh" and len(top.axes) != 1:
        raise SnlabError(f"{where}.devices", f"{len(top.axes)} axes", "one axis (an n-dimensional mesh is nd-full-mesh)")
    if top.wrap_multiple and top.kind != "torus":
        raise SnlabError(f"{where}.wrap_multiple", f"got {top.wrap_multiple} on a {top.kind}", "0: only a torus's "
                         "slices are cut by optical switches")
    if top.devices != domain:
        shape = "x".join(str(a.size) for a in top.axes)
        raise SnlabError(f"{where}.dims", f"{shape} holds {top.devices} devices, the domain {domain}",
                         f"axes whose sizes multiply to domain_size = {domain}")
    links = top.device_bandwidth
    if abs(links / lvl.bandwidth - 1) > 0.02:
        raise SnlabError(f"{name}.bandwidth", f"{lvl.bandwidth / 1e9:.4g} GB/s, but the topology's links give "
                         f"{links / 1e9:.4g} GB/s per device and direction",
                         "the sum over a device's links of their bandwidth per direction (within 2%)")


def _validate_system(obj: "System", name: str) -> None:
    schema.check_range(obj.devices_per_node, "count", f"{name}.devices_per_node")
    if obj.max_devices is not None:
        schema.check_range(obj.max_devices, "count", f"{name}.max_devices")
        if obj.max_devices < obj.scale_up.domain_size:
            raise SnlabError(f"{name}.max_devices", f"{obj.max_devices} < scale_up.domain_size",
                             f">= {obj.scale_up.domain_size}")
    schema.check_range(obj.scale_up.domain_size, "count", f"{name}.scale_up.domain_size")
    for part in ("scale_up", "scale_out"):
        _validate_level(getattr(obj, part), f"{name}.{part}")
    _validate_topology(obj.scale_up, f"{name}.scale_up", obj.scale_up.domain_size)
    _validate_topology(obj.scale_out, f"{name}.scale_out", None)
    for part in ("host", "pool", "storage", "power"):
        sub = getattr(obj, part)
        for f, dimension, _ in schema.SYSTEM[part] if sub is not None else ():
            schema.check_range(getattr(sub, f), dimension, f"{name}.{part}.{f}")
    for kind, cool in obj.cooling.items():
        if kind not in schema.COOLING_KINDS:
            raise SnlabError(f"{name}.cooling.{kind}", "unknown kind of cooling", ", ".join(schema.COOLING_KINDS))
        for f, dimension, _ in schema.SYSTEM["cooling"]:
            if f != "sustained_clock" or cool.sustained_clock:
                schema.check_range(getattr(cool, f), dimension, f"{name}.cooling.{kind}.{f}")
    if obj.cooling and obj.cooling_kind not in obj.cooling:
        raise SnlabError(f"{name}.cooling.kind", f"got {obj.cooling_kind!r}", ", ".join(obj.cooling))
    _validate_device(obj.device, f"{name}.device")


def _validate_device(obj: "Device", name: str) -> None:
    for precision, peak in obj.peak_flops.items():
        schema.check_range(peak, "FLOP/s", f"{name}.compute.{precision}")
    if "bf16" not in obj.peak_flops:
        raise SnlabError(f"{name}.compute.bf16", "missing", "the dense bf16 peak")
    schema.check_range(obj.hbm_capacity, "bytes", f"{name}.hbm_capacity")
    schema.check_range(obj.hbm_bandwidth, "bytes/s", f"{name}.hbm_bandwidth")
    for f in ("gemm_efficiency", "memory_efficiency", "sustained_clock", "allocator_efficiency"):
        schema.check_range(getattr(obj, f), "1", f"{name}.{f}")
    schema.check_range(obj.overlap_contention, "fraction0", f"{name}.overlap_contention")
    schema.check_range(obj.memory_reserve, "bytes0", f"{name}.memory_reserve")
    if obj.memory_reserve >= obj.hbm_capacity:
        raise SnlabError(f"{name}.memory_reserve", f"{obj.memory_reserve:g} B is all of the capacity",
                         f"less than hbm_capacity = {obj.hbm_capacity:g} B")
    for f in ("gemm_efficiency_fp8", "gemm_efficiency_fp4", "flash_attention_efficiency"):
        if getattr(obj, f):   # 0: not set, gemm_efficiency applies
            schema.check_range(getattr(obj, f), "1", f"{name}.{f}")
    for f in ("kernel_floor", "decode_attention_floor", "launch_overhead"):
        schema.check_range(getattr(obj, f), "s", f"{name}.{f}")
    for f in ("gemm_half_elements", "gemm_half_elements_fp8", "gemm_half_elements_fp4"):
        schema.check_range(getattr(obj, f), "count0", f"{name}.{f}")
    schema.check_range(obj.dies, "count", f"{name}.dies")
    if obj.tdp:   # 0: no power model
        for f, dimension, _ in schema.DEVICE["power"]:
            schema.check_range(getattr(obj, f), dimension, f"{name}.{f}")
        if obj.idle_power >= obj.tdp:
            raise SnlabError(f"{name}.idle_power", f"{obj.idle_power:g} W is not below the TDP",
                             f"less than tdp = {obj.tdp:g} W")
    if obj.decode_attention_efficiency:   # 0: not set, gemm_efficiency applies
        schema.check_range(obj.decode_attention_efficiency, "1", f"{name}.decode_attention_efficiency")


def _html_table(title: str, rows) -> str:
    from html import escape
    body = "".join(f"<tr><td>{escape(a)}</td><td>{escape(b)}</td><td><small>{escape(c)}</small></td></tr>"
                   for a, b, c in rows)
    return (f"<table><caption style='text-align:left'><b>{escape(title)}</b></caption>"
            f"<tr><th>quantity</th><th>value</th><th>source</th></tr>{body}</table>")
