"""Where a group sits on a torus or a mesh: slices, and the axes a group spans.

A torus or mesh level (:class:`~snlab.specs.Topology`) has up to three axes, innermost
first. A job runs on a *slice* of it: on a fixed torus or mesh the whole domain; on a
pod whose slices optical circuit switches cut (TPU v4, v5p, TPU7x) a shape the plan
chooses, ``"4x4x8"``, with wrap-around links along an axis whose length is a multiple
of the pod's ``wrap_multiple`` (Google Cloud TPU docs: every slice of whole 4x4x4 cubes
is a full 3D torus). Ranks fill the slice's axes in order, x fastest, as a mesh of JAX
devices or a Megatron rank order fills them, so a group of ``n`` members ``stride``
ranks apart spans, along each axis, the members between ``stride`` and ``stride x n``:
:func:`group_axes` gives, per axis, its members ``k``, the paths its data takes per
direction ``w``, its ring steps, the links crossing its bisection, the bandwidth of its
share of one link and the latency of one step, the inputs of the axis formulas of
:mod:`snlab.walls.communication`. Every function broadcasts over numpy arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import SnlabError
from .grid import where
from . import kernel as _kernel

_kernel.loaded(__name__)

AXES = "xyz"


def link_scale(hw):
    """How much faster the level's links run than the preset says: the hardware's
    per-device bandwidth over what the topology's links add up to (1 unless a sweep or an
    override changes ``scale_up_bandwidth``, which then scales every link alike)."""
    return hw.scale_up_bandwidth / hw.topology.device_bandwidth


def slice_dims(hw) -> tuple:
    """The job's slice along each of the three axes [devices]: the plan's slice where
    the hardware carries one (``slice_x`` > 0), else the topology's axes; 1 beyond them."""
    axes = hw.topology.axes
    dims = []
    for i, name in enumerate(AXES):
        own = float(axes[i].size) if i < len(axes) else 1.0
        given = getattr(hw, f"slice_{name}")
        dims.append(where(given > 0, given, own))
    return tuple(dims)


@dataclass(frozen=True)
class GroupAxes:
    """A group's span of a slice: members ``inner`` per slice and ``slices`` spanned, and
    per axis (x, y, z) the inputs of the axis formulas (``size``, ``paths``, ``steps``,
    ``cut``, ``bandwidth`` [bytes/s], ``latency`` [s]); ``injection`` [bytes/s] is what a
    device sends over the group's links at once."""

    inner: np.ndarray
    slices: np.ndarray
    size: tuple
    paths: tuple
    steps: tuple
    cut: tuple
    bandwidth: tuple
    latency: tuple
    injection: np.ndarray

    def inputs(self) -> dict:
        """The axis formulas' keyword inputs (``axis_size_x`` ...)."""
        out = {}
        for i, a in enumerate(AXES):
            out.update({f"axis_size_{a}": self.size[i], f"axis_paths_{a}": self.paths[i],
                        f"axis_steps_{a}": self.steps[i], f"axis_cut_{a}": self.cut[i],
                        f"axis_bandwidth_{a}": self.bandwidth[i], f"axis_latency_{a}": self.latency[i]})
        return out


def group_axes(n, stride, hw) -> GroupAxes:
    """The axes a group of ``n`` members ``stride`` ranks apart spans in its slice.

    Along axis d of length X with P devices on the axes before it, the group covers
    positions ``stride / P`` (its spacing) to ``stride n / P`` (its span), clipped to
    [1, X]: k = span / spacing members. A ring axis gives the group wrap-around links only
    where it spans the whole slice axis of at least 3, and the slice has them there (on a
    pod cut by optical switches, a slice of whole cubes, every length a multiple of
    ``wrap_multiple``; on a fixed torus, an axis as long as the torus's): 2 paths per
    direction and 2 links across its bisection, else 1 and 1 (a line). Members ``spacing`` apart share each link with the
    ``spacing`` interleaved groups beside them, and each of their steps crosses
    ``spacing`` hops. On a full-mesh axis every pair has its own links (k - 1) l of them
    per device, and the bisection of k members has floor(k/2) ceil(k/2) l; a switch axis
    is one link into a non-blocking switch. A group that does not tile the slice (3 of an
    axis of 4) runs as one line through its members at the slowest link.
    """
    top = hw.topology
    axes = top.axes
    dims = slice_dims(hw)
    per_slice = dims[0] * dims[1] * dims[2]
    inner = where(stride >= per_slice, 1.0, np.minimum(n, np.floor(per_slice / stride)))
    before = 1.0
    size, paths, cut, bandwidth, latency = [], [], [], [], []
    tiled = True
    count = 1.0
    scale = link_scale(hw)
    slowest = min(a.links * a.link_bandwidth for a in axes) * scale
    if top.wrap_multiple:      # slices cut by optical switches: wrap-around on slices of whole cubes
        whole = True
        for X in dims[:len(axes)]:
            whole = whole & (np.mod(X, top.wrap_multiple) == 0)
    for i, X in enumerate(dims):
        low = np.clip(stride / before, 1.0, X)
        high = np.clip(stride * inner / before, 1.0, X)
        k = high / low
        tiled = tiled & (k == np.round(k)) & (np.mod(X, high) == 0) & (np.mod(high, low) == 0)
        count = count * k
        axis = axes[i] if i < len(axes) else axes[0]
        link = axis.links * axis.link_bandwidth * scale
        if axis.kind in ("ring", "line"):
            wraps = (high == X) & (X >= 3) & (axis.kind == "ring")
            # a fixed torus has its wrap-around links only along the whole of an axis
            wraps = wraps & (whole if top.wrap_multiple else (X == axis.size))
            w = where(wraps, 2.0, 1.0)
            paths.append(w)
            cut.append(w)
            bandwidth.append(link / low)
            latency.append(hw.scale_up_latency * low)
        elif axis.kind == "mesh":
            # (an unused axis, k = 1, gets the floors: its terms carry a factor k - 1 = 0)
            paths.append(np.maximum(k - 1, 1.0) * axis.links)
            cut.append(np.maximum(np.floor(k / 2) * np.ceil(k / 2), 1.0) * axis.links)
            bandwidth.append(np.full_like(k, axis.link_bandwidth) * scale)
            latency.append(np.full_like(k, hw.scale_up_latency))
        else:
            # a non-blocking switch joining the meshes below it: one link per device into it,
            # and a bisection as wide as its k members' links, so a device's own link binds
            paths.append(np.ones_like(k))
            cut.append(k)
            bandwidth.append(np.full_like(k, axis.link_bandwidth) * scale)
            latency.append(np.full_like(k, hw.scale_up_latency))
        size.append(k)
        before = before * X
    tiled = tiled & (count == inner)
    # a group that does not tile the slice: one line through its members, at the slowest link
    line = (inner, 1.0, 1.0)
    size = [where(tiled, s, v) for s, v in zip(size, line)]
    paths = [where(tiled, p, 1.0) for p in paths]
    cut = [where(tiled, c, 1.0) for c in cut]
    bandwidth = [where(tiled, b, slowest) for b in bandwidth]
    latency = [where(tiled, a, hw.scale_up_latency) for a in latency]
    steps = [s - 1 for s in size]
    injection = sum(where(s > 1, p * b, 0.0) for s, p, b in zip(size, paths, bandwidth))
    return GroupAxes(inner=inner, slices=n / inner, size=tuple(size), paths=tuple(paths), steps=tuple(steps),
                     cut=tuple(cut), bandwidth=tuple(bandwidth), latency=tuple(latency), injection=injection)


# --- slice shapes ----------------------------------------------------------------------

def parse_slice(text: str, topology) -> tuple[int, ...]:
    """A slice shape ``"4x4x8"`` as axis lengths, checked against the pod: one length per
    axis, each at most the axis's; an error names the field and the allowed shapes."""
    axes = topology.axes
    allowed = (f"lengths along the {len(axes)} axes, e.g. '" + "x".join(str(min(4, a.size)) for a in axes)
               + "', each at most " + "x".join(str(a.size) for a in axes))
    if not isinstance(text, str):
        raise SnlabError("slice", f"got {text!r}", allowed)
    parts = text.lower().split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise SnlabError("slice", f"got {text!r}", allowed) from None
    if len(dims) != len(axes) or any(d < 1 or d > a.size for d, a in zip(dims, axes)):
        raise SnlabError("slice", f"got {text!r}", allowed)
    cube = topology.wrap_multiple
    if cube and not (all(d % cube == 0 for d in dims) or all(d <= cube for d in dims)):
        raise SnlabError("slice", f"got {text!r}", f"whole {cube}-long cubes along every axis (e.g. "
                         f"'{cube}x{cube}x{2 * cube}'), or a slice within one cube")
    return dims


def auto_slice(devices: int, topology) -> tuple[int, ...]:
    """The slice a scheduler gives ``devices`` devices of a pod cut by optical switches,
    as Google's standard shapes are (4x4x4, 4x4x8, 4x8x8, 8x8x8 ... 16x16x24): of the
    valid shapes (:func:`slices_for`), the most cubic one (the shortest longest axis),
    lengths sorted shortest innermost. Jobs no one slice holds span several equal slices
    (multislice): the largest slice size that divides the job and has a valid shape. A
    fixed torus or mesh has one slice, the domain."""
    axes = topology.axes
    if not topology.reconfigurable:
        return tuple(a.size for a in axes)
    # a slice of one device is always valid, so some divisor has a shape
    shapes = next(found for per in reversed(divisors(devices)) if (found := _valid(per, topology)))
    return min(shapes, key=lambda d: (max(d), -min(d), d))


def divisors(n: int) -> list[int]:
    """The divisors of the whole number ``n`` (of its magnitude; none for 0), in
    increasing order: those up to its square root and their partners."""
    n = abs(int(n))
    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return low + [n // d for d in reversed(low) if d * d != n]


def _valid(per: int, topology) -> list[tuple[int, ...]]:
    """Every slice of ``per`` devices a pod cut by optical switches can make: each length
    within the pod's axis, and either whole cubes (every length a multiple of the cube's
    edge, ``wrap_multiple``) or a slice within one cube."""
    limits = [a.size for a in topology.axes]
    cube = topology.wrap_multiple
    found = []

    def grow(prefix, left):
        i = len(prefix)
        if i == len(limits) - 1:
            if left <= limits[i]:
                found.append(tuple(prefix) + (left,))
            return
        for d in divisors(left):
            if d <= limits[i]:
                grow(prefix + [d], left // d)

    grow([], per)
    whole = [f for f in found if all(d % cube == 0 for d in f)]
    within = [f for f in found if all(d <= cube for d in f)]
    return sorted(set(whole + within))


def slices_for(devices: int, topology) -> list[tuple[int, ...]]:
    """Every slice shape of a pod cut by optical switches for ``devices`` devices (or for
    the share of them one slice holds, :func:`auto_slice`): each ordering of lengths along
    the axes that the pod can make. For a fixed topology, its one slice."""
    if not topology.reconfigurable:
        return [tuple(a.size for a in topology.axes)]
    return _valid(math.prod(auto_slice(devices, topology)), topology)


def slice_text(dims) -> str:
    """A slice shape as text: ``"4x4x8"``."""
    return "x".join(str(int(d)) for d in dims)


def slice_columns(topology, devices, given=None) -> tuple:
    """The slice (lengths along x, y, z) of each row's job: ``given`` (a shape per row,
    as a list indexed by ``given[1]``: ``(shapes, index)``), else the scheduler's shape for
    the row's ``devices`` (:func:`auto_slice`); broadcast like ``devices``."""
    devices = np.asarray(devices, dtype=float)
    out = [np.ones(devices.shape) for _ in AXES]
    shapes, index = given if given is not None else ([None], np.zeros(devices.shape, dtype=int))
    index = np.broadcast_to(np.asarray(index, dtype=int), devices.shape)
    for n, pick in np.unique(np.stack([devices.ravel(), index.ravel()], axis=1), axis=0):
        shape = shapes[int(pick)] or auto_slice(int(n), topology)
        rows = (devices == n) & (index == pick)
        for i, length in enumerate((tuple(shape) + (1, 1))[:3]):
            out[i] = np.where(rows, float(length), out[i])
    return tuple(o[()] for o in out)


def check_slice(dims, devices: int, field: str = "slice") -> None:
    """A job of ``devices`` devices runs on one slice of ``dims`` or on several equal ones."""
    size = math.prod(dims)
    if devices > size and devices % size:
        raise SnlabError(field, f"{slice_text(dims)} holds {size} devices; the job has {devices}",
                         f"a slice of at least {devices} devices, or one whose size divides it")


def one_ring(system, devices: int):
    """The same chips and links wired as one ring of ``devices``: what a torus slice is
    compared with (every chip keeps two of its links, to its two ring neighbours, at the
    slowest axis's rate). A teaching what-if, not a shipped system."""
    from .specs import Axis, Topology
    axes = system.scale_up.topology.axes
    link = min(a.links * a.link_bandwidth for a in axes)
    return system.replace(name=f"{system.name} as one ring", scale_up_domain_size=int(devices),
                          scale_up_bandwidth=2 * link,
                          scale_up_topology=Topology("torus", axes=(Axis("ring", int(devices), link),)))
