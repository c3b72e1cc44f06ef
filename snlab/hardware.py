"""A system's numbers as the step models read them: one frozen :class:`Hardware`.

Every field is a float in SI units, or a numpy array when a sweep varies it. The
names are the ones a sweep or a single call may override (``scale_out_bandwidth``,
``hbm_capacity``, ...), so a system field has one name from the preset to the
DataFrame column.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from .formula_cache import generation
from .walls import memory as mw
from . import kernel as _kernel

_kernel.loaded(__name__)

if TYPE_CHECKING:
    from .specs import System

#: bytes per element of each precision (weights, KV cache, messages); fp4 is NVIDIA's NVFP4,
#: 16 four-bit values sharing one FP8 (E4M3) scale: 4.5 bits an element (NVIDIA technical
#: blog, 'Introducing NVFP4 for efficient and accurate low-precision inference', 2025-06;
#: the per-tensor FP32 scale is negligible). 8-bit formats' per-channel or 128-element
#: block scales add under 1% and are left out
DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5625}
#: activations, tensor-parallel messages and the expert combine: 16-bit
ACTIVATION_BYTES = 2.0
#: bytes of extra memory traffic per element a matrix multiply takes in FP8 with Transformer
#: Engine on Hopper: the 16-bit tensor read (2), its FP8 copy written (1) and, since Hopper's
#: FP8 GEMMs take only the TN layout, a transposed FP8 copy written for the other GEMM of the
#: backward pass (1) (Transformer Engine, low-precision training: performance
#: considerations, 'Handling transposes')
FP8_CAST_BYTES = 4.0
#: bytes per weight element of the FP8 copies Transformer Engine keeps beside each 16-bit
#: GEMM weight through a training step: on Hopper a row-wise and a transposed column-wise
#: copy (2), on Blackwell one layout serves both (1) (Transformer Engine, low-precision
#: training: performance considerations, 'Memory usage': "FP8 training does not always
#: reduce memory"); none when the weights themselves are kept in FP8 (fp8_param)
FP8_WEIGHT_COPY_BYTES = {"H100": 2.0, "B200": 1.0, "B300": 1.0}


@dataclass(frozen=True)
class Hardware:
    """A system's numbers [SI units]: the scale-up and scale-out levels, host link,
    memory pool and storage, and the device (peak at the chosen precision).

    ``peak_flops`` and ``gemm_efficiency`` are the matrix multiplies' at the chosen
    precision; ``topology`` is the scale-up level's wiring (:class:`~snlab.specs.Topology`)
    and ``slice_x``, ``slice_y``, ``slice_z`` the job's slice of a torus or mesh along its
    axes (0: the whole domain); a switch level's groups spanning more than
    ``<level>_tier_devices`` devices get 1/``<level>_oversubscription`` of its bandwidth.
    Attention runs in 16-bit (FlashAttention), at ``attention_peak_ratio`` of
    that peak and ``attention_efficiency_ratio`` of that efficiency (1 for bf16).
    ``memory_reserve`` and ``allocator_efficiency`` make the usable memory,
    ``overlap_contention`` the compute lost per second of hidden communication.
    ``pool_capacity`` is per device (the domain's pool over its devices);
    ``pool_domain_capacity`` the whole domain's. ``ep_*_efficiency`` are 0 where the
    preset has no measurement of that expert-parallel kernel (the level's
    ``efficiency`` applies), as is ``decode_attention_efficiency`` (then
    ``gemm_efficiency`` applies). ``peak_ratio_<dtype>`` is the dense peak at a
    precision over the bf16 peak (1 where the device has no faster path).
    """

    scale_up_domain_size: float
    scale_up_bandwidth: float
    scale_up_latency: float
    scale_up_efficiency: float
    scale_up_call_latency: float
    scale_out_bandwidth: float
    scale_out_latency: float
    scale_out_efficiency: float
    scale_out_call_latency: float
    host_bandwidth: float
    host_capacity: float
    host_latency: float
    host_memory_bandwidth: float
    pool_bandwidth: float
    pool_capacity: float
    pool_domain_capacity: float
    pool_latency: float
    storage_bandwidth: float
    storage_latency: float
    storage_capacity: float
    peak_flops: float
    hbm_bandwidth: float
    hbm_capacity: float
    gemm_efficiency: float
    memory_efficiency: float
    sustained_clock: float
    dies: float
    decode_attention_efficiency: float
    scale_up_ep_dispatch_efficiency: float
    scale_up_ep_combine_efficiency: float
    scale_up_ep_bulk_efficiency: float
    scale_out_ep_dispatch_efficiency: float
    scale_out_ep_combine_efficiency: float
    scale_out_ep_bulk_efficiency: float
    flash_attention_efficiency: float = 0.0
    kernel_floor: float = 0.0
    decode_attention_floor: float = 0.0
    launch_overhead: float = 0.0
    scale_up_direct_call_latency: float = 0.0
    scale_up_node_latency: float = 0.0
    devices_per_node: float = 0.0
    cast_bytes: float = 0.0
    weight_copy_bytes: float = 0.0
    memory_reserve: float = 0.0
    allocator_efficiency: float = 1.0
    overlap_contention: float = 0.0
    attention_peak_ratio: float = 1.0
    attention_efficiency_ratio: float = 1.0
    peak_ratio_bf16: float = 1.0
    peak_ratio_fp16: float = 1.0
    peak_ratio_fp8: float = 1.0
    peak_ratio_int8: float = 1.0
    peak_ratio_fp4: float = 1.0
    efficiency_ratio_bf16: float = 1.0
    efficiency_ratio_fp16: float = 1.0
    efficiency_ratio_fp8: float = 1.0
    efficiency_ratio_int8: float = 1.0
    efficiency_ratio_fp4: float = 1.0
    gemm_half_bf16: float = 0.0
    gemm_half_fp16: float = 0.0
    gemm_half_fp8: float = 0.0
    gemm_half_int8: float = 0.0
    gemm_half_fp4: float = 0.0
    tdp: float = 0.0
    idle_power: float = 0.0
    hbm_energy: float = 0.0
    link_energy: float = 0.0
    host_power: float = 0.0
    switch_power: float = 0.0
    network_power: float = 0.0
    pue: float = 1.0
    power_cap: float = 0.0
    devices_per_rack: float = 0.0
    network_racks: float = 0.0
    scale_up_oversubscription: float = 1.0
    scale_up_tier_devices: float = 0.0
    scale_out_oversubscription: float = 1.0
    scale_out_tier_devices: float = 0.0
    slice_x: float = 0.0
    slice_y: float = 0.0
    slice_z: float = 0.0
    topology: object = None

    def replace(self, **changes) -> "Hardware":
        """A copy with fields changed (sweep axes, overrides of one call). A new
        per-device ``pool_capacity`` sets the domain's pool to match."""
        if "pool_capacity" in changes and "pool_domain_capacity" not in changes:
            domain = changes.get("scale_up_domain_size", self.scale_up_domain_size)
            changes = {**changes, "pool_domain_capacity": changes["pool_capacity"] * domain}
        return dataclasses.replace(self, **changes)

    def free_pool(self, in_domain):
        """Pool bytes the ``in_domain`` devices of a job in one scale-up domain can borrow
        together [bytes]. A supernode's pool is its devices' memory lent to peers (the
        preset's capacity is what one device sees: its domain's other devices' memory), so
        each device outside the job lends the pool's capacity over the domain's other
        devices. It does not depend on the job's own HBM: more HBM never shrinks it."""
        domain = self.scale_up_domain_size
        per_peer = self.pool_domain_capacity / np.maximum(domain - 1, 1.0)
        return np.maximum(domain - in_domain, 0.0) * per_peer

    def roofline(self, peak_flops=None, gemm_efficiency=None) -> dict:
        """The inputs of the compute wall's roofline formulas, at ``peak_flops`` (default
        this hardware's peak) and ``gemm_efficiency`` (default the device's)."""
        return roofline_inputs(self.peak_flops if peak_flops is None else peak_flops,
                               self.gemm_efficiency if gemm_efficiency is None else gemm_efficiency,
                               self.sustained_clock, self.hbm_bandwidth, self.memory_efficiency)

    def attention_roofline(self, flash=1.0) -> dict:
        """The roofline inputs of attention kernels, which run in 16-bit whatever the
        precision of the matrix multiplies (FlashAttention; Transformer Engine's FP8
        attention is off by default): at the fused kernel's measured efficiency where
        ``flash`` and the device has one, else as 16-bit matrix multiplies."""
        bf16 = self.gemm_efficiency * self.attention_efficiency_ratio
        fused = self.flash_attention_efficiency
        if type(flash) is type(fused) is type(bf16) is np.float64:       # one plan: a scalar
            efficiency = fused if flash > 0 and fused > 0 else bf16
        else:
            fused = np.asarray(fused)
            efficiency = np.where((np.asarray(flash) > 0) & (fused > 0), fused, bf16)
        return self.roofline(peak_flops=self.peak_flops * self.attention_peak_ratio, gemm_efficiency=efficiency)

    def host_roofline(self) -> dict:
        """Roofline inputs of the host CPU for a memory-bound step (the offloaded
        optimizer's): host DRAM at its peak, with no compute term that could bind."""
        return roofline_inputs(1.0, 1.0, 1.0, self.host_memory_bandwidth, 1.0)

    @property
    def usable_memory(self):
        """Bytes a job can allocate on one device (:data:`snlab.walls.memory.usable_memory`)."""
        return mw.usable_memory(capacity=self.hbm_capacity, memory_reserve=self.memory_reserve,
                                allocator_efficiency=self.allocator_efficiency)

    def peak_ratio(self, dtype: str):
        """Dense peak at ``dtype`` over the bf16 peak."""
        return getattr(self, f"peak_ratio_{dtype}")

    def gemm_half(self, dtype: str):
        """Output elements at which a GEMM at ``dtype`` runs at half its large-GEMM rate."""
        return getattr(self, f"gemm_half_{dtype}")

    def efficiency_ratio(self, dtype: str):
        """Large-GEMM efficiency at ``dtype`` over the bf16 one."""
        return getattr(self, f"efficiency_ratio_{dtype}")


def roofline_inputs(peak_flops, gemm_efficiency, sustained_clock, memory_bandwidth, memory_efficiency) -> dict:
    """The keyword inputs of :data:`snlab.walls.compute.roofline_time` and ``gemm_time``."""
    return dict(peak_flops=peak_flops, gemm_efficiency=gemm_efficiency, sustained_clock=sustained_clock,
                memory_bandwidth=memory_bandwidth, memory_efficiency=memory_efficiency)


def device_roofline(device, precision: str = "bf16", sustained_clock=None) -> dict:
    """The roofline inputs of one device at ``precision`` (its own sustained clock unless given)."""
    return roofline_inputs(device.peak(precision), device.gemm_efficiency,
                           device.sustained_clock if sustained_clock is None else sustained_clock,
                           device.hbm_bandwidth, device.memory_efficiency)


#: every field, in order: the names a sweep may vary (the ratios are derived, not set)
FIELDS = tuple(f.name for f in dataclasses.fields(Hardware)
               if not f.name.startswith(("peak_ratio_", "efficiency_ratio_", "gemm_half_", "attention_", "slice_"))
               and f.name not in ("cast_bytes", "weight_copy_bytes", "topology")
               and not f.name.endswith(("_oversubscription", "_tier_devices")))


@lru_cache(maxsize=256)
def hardware(system: "System", precision: str = "bf16") -> Hardware:
    """The numbers of ``system`` [SI units] with the device's dense peak at ``precision``."""
    dev, up, out, pool, store = system.device, system.scale_up, system.scale_out, system.pool, system.storage
    bf16 = dev.peak("bf16")
    levels = {f"{name}_{field}": getattr(level, field) for name, level in (("scale_up", up), ("scale_out", out))
              for field in ("ep_dispatch_efficiency", "ep_combine_efficiency", "ep_bulk_efficiency")}
    return _numpy_scalars(Hardware(
        scale_up_domain_size=float(up.domain_size), scale_up_bandwidth=up.bandwidth, scale_up_latency=up.latency,
        scale_up_efficiency=up.efficiency, scale_up_call_latency=up.call_latency,
        scale_out_bandwidth=out.bandwidth, scale_out_latency=out.latency, scale_out_efficiency=out.efficiency,
        scale_out_call_latency=out.call_latency,
        host_bandwidth=system.host.bandwidth, host_capacity=system.host.capacity, host_latency=system.host.latency,
        host_memory_bandwidth=system.host.memory_bandwidth,
        scale_up_node_latency=up.node_latency or up.latency, devices_per_node=float(system.devices_per_node),
        pool_bandwidth=pool.bandwidth if pool else 0.0,
        pool_capacity=(pool.capacity / up.domain_size) if pool else 0.0,
        pool_domain_capacity=pool.capacity if pool else 0.0, pool_latency=pool.latency if pool else 0.0,
        storage_bandwidth=store.bandwidth if store else 0.0, storage_latency=store.latency if store else 0.0,
        storage_capacity=store.capacity if store else 0.0,
        peak_flops=dev.peak(precision), hbm_bandwidth=dev.hbm_bandwidth, hbm_capacity=dev.hbm_capacity,
        gemm_efficiency=dev.gemm_efficiency_at(precision), memory_efficiency=dev.memory_efficiency,
        memory_reserve=dev.memory_reserve, allocator_efficiency=dev.allocator_efficiency,
        overlap_contention=dev.overlap_contention, attention_peak_ratio=bf16 / dev.peak(precision),
        flash_attention_efficiency=dev.flash_attention_efficiency,
        cast_bytes=FP8_CAST_BYTES if precision == "fp8" else 0.0,
        weight_copy_bytes=FP8_WEIGHT_COPY_BYTES.get(dev.family, 2.0) if precision == "fp8" else 0.0,
        attention_efficiency_ratio=dev.gemm_efficiency / dev.gemm_efficiency_at(precision),
        sustained_clock=dev.sustained_clock, dies=float(dev.dies),
        decode_attention_efficiency=dev.decode_attention_efficiency, **levels,
        kernel_floor=dev.kernel_floor, decode_attention_floor=dev.decode_attention_floor,
        launch_overhead=dev.launch_overhead, scale_up_direct_call_latency=up.direct_call_latency,
        **{f"peak_ratio_{d}": dev.peak_flops.get(d, bf16) / bf16 for d in DTYPE_BYTES},
        **{f"efficiency_ratio_{d}": dev.gemm_efficiency_at(d) / dev.gemm_efficiency for d in DTYPE_BYTES},
        **{f"gemm_half_{d}": dev.gemm_half_elements_at(d) for d in DTYPE_BYTES},
        **_power_fields(system),
        **{f"{name}_{f}": float(getattr(level.topology, f)) for name, level in (("scale_up", up), ("scale_out", out))
           for f in ("oversubscription", "tier_devices")},
        topology=up.topology,
    ))


def _power_fields(system: "System") -> dict:
    """The power fields of :class:`Hardware` under the system's cooling (empty without a
    power model)."""
    if not system.has_power:
        return {}
    from .power_cooling import cooling_state
    dev, pw, cool = system.device, system.power, cooling_state(system)
    return dict(tdp=dev.tdp, idle_power=dev.idle_power, hbm_energy=dev.hbm_energy, link_energy=dev.link_energy,
                host_power=pw.host_power, switch_power=pw.switch_power, network_power=pw.network_power,
                pue=cool.pue, power_cap=cool.device_cap_w, devices_per_rack=float(cool.devices_per_rack),
                network_racks=float(pw.network_racks))


def _numpy_scalars(hw: Hardware) -> Hardware:
    """Every field as a numpy float64, so that arithmetic on a single plan follows
    numpy's rules (a division by zero is inf, never a Python exception)."""
    return dataclasses.replace(hw, **{f.name: np.float64(getattr(hw, f.name)) for f in dataclasses.fields(hw)
                                      if f.name != "topology"})


#: where each hardware field comes from in a preset: (schema table, section, field);
#: ``pool_capacity`` is the domain's pool over its devices, in the pool's dimension
PRESET_FIELDS = {
    **{f"{level}_{f}": ("system", level, f) for level in ("scale_up", "scale_out")
       for f in ("bandwidth", "latency", "efficiency", "call_latency", "direct_call_latency", "ep_dispatch_efficiency",
                 "ep_combine_efficiency", "ep_bulk_efficiency")},
    "scale_up_domain_size": ("system", "scale_up", "domain_size"),
    "scale_up_node_latency": ("system", "scale_up", "node_latency"),
    **{f"host_{f}": ("system", "host", f) for f in ("bandwidth", "capacity", "latency", "memory_bandwidth")},
    **{f"pool_{f}": ("system", "pool", f) for f in ("bandwidth", "capacity", "latency")},
    "pool_domain_capacity": ("system", "pool", "capacity"),
    **{f"storage_{f}": ("system", "storage", f) for f in ("bandwidth", "latency", "capacity")},
    "devices_per_node": ("system", "", "devices_per_node"),
    "peak_flops": ("device", "compute", "bf16"), "dies": ("device", "", "dies"),
    "hbm_bandwidth": ("device", "memory", "hbm_bandwidth"), "hbm_capacity": ("device", "memory", "hbm_capacity"),
    **{f: ("device", "calibration", f) for f in ("gemm_efficiency", "memory_efficiency", "sustained_clock",
                                                 "decode_attention_efficiency", "memory_reserve",
                                                 "allocator_efficiency", "overlap_contention",
                                                 "flash_attention_efficiency", "kernel_floor",
                                                 "decode_attention_floor", "launch_overhead")},
    **{f: ("device", "power", f) for f in ("tdp", "idle_power", "hbm_energy", "link_energy")},
    **{f: ("system", "power", f) for f in ("host_power", "switch_power", "network_power", "devices_per_rack",
                                           "network_racks")},
    "pue": ("system", "cooling", "pue"), "power_cap": ("device", "power", "tdp"),
}


def field_dimension(name: str) -> str:
    """The dimension of a hardware field, as :func:`snlab.schema.check_range` takes it:
    the preset field's own (:data:`PRESET_FIELDS`, :mod:`snlab.schema`), so that a value
    is held to one range in a preset file, a sweep axis and a command-line flag."""
    from . import schema
    table, section, field = PRESET_FIELDS[name]
    spec = (schema.SYSTEM if table == "system" else schema.DEVICE)[section]
    return next(d for f, d, _ in spec if f == field)


#: how many hardware objects keep memoised values at once (the systems of the latest calls),
#: and how many values each keeps before it starts again
MEMO_SIZE, MEMO_ENTRIES = 32, 4096
_MEMOS: dict[int, tuple] = {}
#: the numeric fields of a Hardware, and the types of them whose values can be kept
_NUMBERS = tuple(f.name for f in dataclasses.fields(Hardware) if f.name != "topology")
_IMMUTABLE = frozenset((float, int, np.float64, np.int64))


def memo(hw: Hardware) -> dict | None:
    """A dictionary for values computed from ``hw`` and scalar arguments alone (where
    the groups of a plan sit on the levels, and their inputs), kept for the
    :data:`MEMO_SIZE` hardware objects last asked about, at most :data:`MEMO_ENTRIES`
    values each; None when ``hw`` holds arrays (a sweep's hardware axes, or a 0-d
    array, which can change), whose values are not kept. Keyed by identity: each entry holds its hardware, so no other object
    can take its id (a frozen Hardware of numpy scalars cannot change). Values computed
    from formulas are dropped when a wall module loads again
    (:func:`snlab.formula_cache.generation`)."""
    held = _MEMOS.get(id(hw))
    if held is None or held[0] is not hw or held[1] is not generation():
        if len(_MEMOS) >= MEMO_SIZE:
            _MEMOS.clear()
        scalar = all(type(getattr(hw, name)) in _IMMUTABLE for name in _NUMBERS)
        held = _MEMOS[id(hw)] = (hw, generation(), {} if scalar else None)
    kept = held[2]
    if kept is not None and len(kept) >= MEMO_ENTRIES:
        kept.clear()
    return kept
