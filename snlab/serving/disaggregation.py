"""Disaggregated prefill and decode: pools of instances, each with its own parallel
plan, and each request's KV cache moved from one to the other.

A deployment of ``n_P`` prefill and ``n_D`` decode instances (xPyD) routes requests to
the prefill instances in turn (round robin), and each finished prefill to the decode
instances in turn. The prefill instance emits the first token (DistServe, Splitwise and
Mooncake count the time to first token there); the decode instance reserves the
request's KV cache first, then takes it over its link, one transfer after another
(SGLang's pre-allocation, vLLM's push mode), and decodes it from the next step after it
lands: the transfer shows in the gap to the second token, and the memory it holds in the
decode pool's admissions.

The transfer is priced on the system's levels (:func:`snlab.network.point_to_point`):
each of the ``min(g_P, g_D)`` device pairs sends its share of the bytes over its own
link, at the level's bandwidth, efficiency and per-message latency. The two instances
talk over the scale-up level when they sit in one scale-up domain (on a supernode, its
bus; in an 8-GPU server, NVLink if a unit of the pools fits in it), over the scale-out
network (RDMA) otherwise; ``kv_link_level`` forces either (CloudMatrix-Infer itself sends the prefill's KV
cache over its RoCE plane, Zuo et al. 2025 Sec. 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import network as net
from ..errors import SnlabError
from ..hardware import hardware
from ..presets import system as load_system
from .queueing import Run, run_instance
from .service import Service
from .workload import Requests

KV_LINKS = ("auto", "scale-up", "scale-out")


@dataclass(frozen=True)
class Link:
    """The path of a request's KV cache from a prefill to a decode instance: which
    level, how many device links in parallel, and each link's bandwidth [bytes/s],
    achieved fraction and latency per message [s] (call latency included)."""

    level: str
    links: int
    bandwidth: float
    efficiency: float
    latency: float

    @property
    def effective_bandwidth(self) -> float:
        """Bytes per second the transfer moves over all its links [bytes/s]."""
        return self.links * self.bandwidth * self.efficiency


def kv_link(system, prefill_devices: int, decode_devices: int, link: str = "auto", unit_devices: int = 0) -> Link:
    """The level a request's KV cache crosses (see the module docstring): the scale-up
    level when the deployment's unit of pools (``unit_devices``, at least one instance of
    each) fits in one scale-up domain."""
    if link not in KV_LINKS:
        raise SnlabError("kv_link_level", f"got {link!r}", ", ".join(KV_LINKS))
    hw = hardware(load_system(system))
    together = max(unit_devices, prefill_devices + decode_devices) <= hw.scale_up_domain_size
    if link == "scale-up" and not together:
        raise SnlabError("kv_link_level", f"a prefill and a decode instance ({prefill_devices} + {decode_devices} devices) "
                         f"do not fit in one scale-up domain of {hw.scale_up_domain_size:.0f}",
                         "auto or scale-out, or smaller instances")
    up = link == "scale-up" or (link == "auto" and together)
    level = "scale_up" if up else "scale_out"
    return Link(level="scale-up" if up else "scale-out", links=min(prefill_devices, decode_devices),
                bandwidth=float(getattr(hw, f"{level}_bandwidth")), efficiency=float(getattr(hw, f"{level}_efficiency")),
                latency=float(getattr(hw, f"{level}_latency") + getattr(hw, f"{level}_call_latency")))


def transfer_times(system, link: Link, kv_bytes) -> np.ndarray:
    """Seconds to move each request's ``kv_bytes`` over ``link``: every device pair its
    share, as one point-to-point message on the link's level
    (:func:`snlab.network.point_to_point`; over the scale-up level it takes the faster of
    the bus and the NIC, as a device keeps both)."""
    hw = hardware(load_system(system))
    share = np.asarray(kv_bytes, dtype=float) / link.links
    return np.asarray(net.point_to_point(share, link.level == "scale-up", hw), dtype=float)


@dataclass(frozen=True)
class DisaggregatedRun:
    """A disaggregated run: each request's timeline as a colocated run has it (arrival,
    prefill start, first token, last token, with the KV transfer's start and end), each
    request's KV bytes and transfer time, the pools' runs, and the link."""

    run: Run
    kv_bytes: np.ndarray
    transfer_s: np.ndarray
    prefill_runs: list
    decode_runs: list
    link: Link


def run_disaggregated(prefill: Service, decode: Service, requests: Requests, prefill_instances: int,
                      decode_instances: int, link: Link, cached=None) -> DisaggregatedRun:
    """Run ``requests`` through ``prefill_instances`` prefill and ``decode_instances``
    decode instances, both pools in turn (round robin)."""
    n = len(requests)
    cached = np.zeros(n) if cached is None else cached
    ids = np.arange(n)
    first = np.full(n, np.nan)
    admitted = np.full(n, np.nan)
    prefill_runs = []
    for p in range(prefill_instances):
        mine = ids[p::prefill_instances]
        part = Requests(requests.arrival_s[mine], requests.prompt[mine], requests.output[mine])
        r = run_instance(prefill, part, "prefill-only", cached=cached[mine])
        first[mine], admitted[mine] = r.first, r.admitted
        prefill_runs.append(r)
    kv_bytes = requests.prompt * prefill.kv_bytes_per_token
    transfer = transfer_times(prefill.system, link, kv_bytes)
    order = np.argsort(first, kind="stable")
    last, x_start, x_end = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    gaps, batches, decode_runs = [], [], []
    for d in range(decode_instances):
        mine = order[d::decode_instances]
        part = Requests(requests.arrival_s[mine], requests.prompt[mine], requests.output[mine])
        r = run_instance(decode, part, "decode-only", first_token=first[mine], transfer_s=transfer[mine])
        last[mine], x_start[mine], x_end[mine] = r.last, r.transfer_start, r.transfer_end
        gaps.append(r.gaps)
        batches.append(r.batches)
        decode_runs.append(r)
    end = max([r.end for r in prefill_runs + decode_runs])
    run = Run(requests.arrival_s, admitted, first, last, x_start, x_end, np.concatenate(gaps),
              np.concatenate(batches), max(r.peak_kv_tokens for r in decode_runs), end)
    return DisaggregatedRun(run, kv_bytes, transfer, prefill_runs, decode_runs, link)
