"""The result of one serving deployment: JSON form, text table and Jupyter display."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..hardware import DTYPE_BYTES
from .. import uncertainty
from ..result import Result
from ..specs import Model, System
from ..training.result import power_fields, power_rows
from ..units import fmt_bytes, fmt_rate, fmt_seconds
from .deployment import OUTPUT_DISTS, SCENARIOS
from .step import KV_LOCATIONS, KV_TIERS

_TIME_PARTS = ("kv", "weights", "dense", "experts", "attention", "elementwise", "fixed", "sampling", "tp", "ep", "pp")


#: the offline scenario's outputs: (key of ServeResult.offline, column)
_OFFLINE = (("tokens_per_s", "offline_tokens_per_s"), ("tokens_per_s_per_device", "offline_tokens_per_s_per_device"),
            ("ttft_s", "offline_ttft_s"), ("tpot_s", "offline_tpot_s"), ("sequences", "offline_sequences"),
            ("kv_sequences", "offline_kv_sequences"), ("waves", "offline_waves"), ("step_tokens", "offline_step_tokens"),
            ("prefill_chunks", "offline_prefill_chunks"), ("makespan_s", "offline_makespan_s"),
            ("max_batch_size", "offline_max_batch_size"),
            ("kv_pool_bytes_per_device", "offline_kv_pool_bytes_per_device"))
_WALLS = ("compute", "memory", "communication")


@dataclass(frozen=True)
class ServeResult(Result):
    """One deployment of a model on a system: latencies, throughputs, KV placement.

    Times are seconds, throughputs tokens per second, memory bytes per device.
    ``time_s`` holds the parts of one decode step (``kv`` and ``weights`` are memory
    reads, ``dense``/``experts``/``attention`` rooflines, ``tp``/``ep``/``pp``
    communication; ``fixed`` the kernels' fixed times, ``sampling`` the sampler's;
    ``ep_exposed`` what two-batch overlap leaves visible; ``draft_head`` the draft
    tokens' passes through the output head, part of ``dense``). ``offline`` holds the
    offline scenario's run (``scenario="offline"``): output tokens per second of the whole
    deployment and per device, mean TTFT and TPOT, the sequences the engine keeps in
    flight per replica, how many the KV cache holds, the bytes the engine allocates for it on
    each device (``kv_pool_bytes_per_device``) and the engine's max_batch_size (per
    pipeline stage; a replica keeps pp x that in flight at most), its waves, the step's token budget,
    the chunks a wave's prefill takes and the run's time; empty otherwise.
    ``lender_devices`` are the peers whose HBM the KV cache borrows through the pool:
    they serve nothing meanwhile, so every per-device throughput counts them.
    ``*_low`` / ``*_high`` bound the decode and prefill figures by the error bands of
    published serving runs on the same chip family (``band_runs`` decode runs, ``band``
    in words; None without published runs).
    """

    model: str
    system: str
    deployment: dict
    devices: int
    ttft_s: float
    tpot_s: float
    decode_step_s: float
    tokens_per_step: float
    decode_tokens_per_s: float
    decode_tokens_per_s_per_device: float
    prefill_tokens_per_s_per_device: float
    weights_bytes_per_device: float
    kv_cache_bytes_per_device: float
    kv_location: str
    fits: bool
    limited_by: str
    reason: str
    kv_bytes_per_device: dict = field(repr=False)
    kv: dict = field(repr=False)
    time_s: dict = field(repr=False)
    limits: dict = field(repr=False)
    batching: dict = field(repr=False)
    lender_devices: int = 0
    offline: dict = field(default_factory=dict, repr=False)
    tpot_s_low: float | None = None
    tpot_s_high: float | None = None
    decode_tokens_per_s_per_device_low: float | None = None
    decode_tokens_per_s_per_device_high: float | None = None
    prefill_tokens_per_s_per_device_low: float | None = None
    prefill_tokens_per_s_per_device_high: float | None = None
    band_runs: int = 0
    band: str = ""
    cooling: str = ""
    device_power_w: float | None = None
    it_power_w: float | None = None
    facility_power_w: float | None = None
    energy_per_token_j: float | None = None
    cost_per_million_tokens_usd: float | None = None
    power: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_row(cls, model: Model, system: System, g: dict, row: dict, prices=None) -> "ServeResult":
        dtypes = list(DTYPE_BYTES)
        dep = {k: int(g[k]) for k in ("tp", "pp", "dp", "ep", "batch", "prompt_len", "output_len", "context",
                                      "draft_tokens", "microbatches", "prefill_batch")}
        dep.update({k: int(g[k]) for k in ("requests", "max_sequences", "max_step_tokens", "kv_block_tokens")})
        dep.update(scenario=SCENARIOS[int(g["scenario"])], expert_imbalance=g["expert_imbalance"],
                   graphs=bool(g["graphs"]), host_step_s=g["host_step_s"], kv_fraction=g["kv_fraction"],
                   engine_memory_bytes=g["engine_memory_bytes"])
        if dep["scenario"] == "offline":      # the batch the engine keeps in flight
            dep["batch"] = int(row["batch_in_flight"])
        dep.update(capacity_context=int(g["capacity_context"]), acceptance=g["acceptance"],
                   weight_dtype=dtypes[int(g["weight_dtype"])], kv_dtype=dtypes[int(g["kv_dtype"])],
                   hbm_utilization=g["hbm_utilization"], pool_share=g["pool_share"], ep_overlap=None if g["ep_overlap"] != g["ep_overlap"] else g["ep_overlap"],
                   kv_offload=("hbm", "auto")[int(g["kv_offload"])],
                   output_dist=OUTPUT_DISTS[int(g["output_dist"])])
        location = KV_LOCATIONS[int(row["kv_location"])]
        by_tier = {t: row[f"kv_{t}_bytes_per_device"] for t in KV_TIERS}
        reason = _reason(system, g, row, by_tier, dep["scenario"] == "offline")
        walls = {w: row[f"wall_{w}_s"] for w in _WALLS}
        limited = "memory" if not row["fits"] else max(walls, key=walls.get)
        time_s = {p: row[f"time_{p}_s"] for p in _TIME_PARTS}
        time_s["ep_exposed"] = row["exposed_ep_s"]
        offline = ({k: (int(row[c]) if k in ("sequences", "kv_sequences", "waves", "step_tokens", "prefill_chunks",
                                             "max_batch_size")
                        else row[c]) for k, c in _OFFLINE} if dep["scenario"] == "offline" else {})
        time_s["draft_head"] = row["time_draft_head_s"]
        time_s["walls"] = walls
        time_s["prefill"] = {"tp": row["prefill_time_tp_s"], "ep": row["prefill_time_ep_s"],
                             "ep_exposed": row["prefill_exposed_ep_s"]}
        kv = {"bytes_per_token": row["kv_bytes_per_token"],
              "read_bytes_per_step_per_device": row["kv_read_bytes_per_step_per_device"],
              "time_per_output_token_s": row["kv_time_per_output_token_s"],
              "spill_slowdown": row["kv_spill_slowdown"]}
        limits = {"max_batch": int(row["max_batch"]), "max_batch_hbm": int(row["max_batch_hbm"]),
                  "max_context": int(row["max_context"]), "max_context_hbm": int(row["max_context_hbm"])}
        batching = {"continuous_tokens_per_s_per_device": row["continuous_tokens_per_s_per_device"],
                    "static_tokens_per_s_per_device": row["static_tokens_per_s_per_device"],
                    "continuous_over_static": row["continuous_over_static"]}
        decode = uncertainty.band("serving decode", system.device.family)
        prefill = uncertainty.band("serving prefill", system.device.family)
        bands = dict(zip(("tpot_s_low", "tpot_s_high"), decode.time(float(row["tpot_s"]))))
        bands.update(zip(("decode_tokens_per_s_per_device_low", "decode_tokens_per_s_per_device_high"),
                         decode.speed(float(row["decode_tokens_per_s_per_device"]))))
        bands.update(zip(("prefill_tokens_per_s_per_device_low", "prefill_tokens_per_s_per_device_high"),
                         prefill.speed(float(row["prefill_tokens_per_s_per_device"]))))
        if offline:
            regime = uncertainty.band(uncertainty.offline_regime(dep["prompt_len"], dep["output_len"]),
                                      system.device.family)
            offline.update(zip(("tokens_per_s_per_device_low", "tokens_per_s_per_device_high"),
                               regime.speed(float(offline["tokens_per_s_per_device"]))))
            offline["band"] = regime.describe()
        return cls(**bands, band_runs=decode.runs, band=decode.describe() + "; " + prefill.describe(),
                   **power_fields(system, row, prices),
                   lender_devices=int(row["lender_devices"]),
                   model=model.name, system=system.name, deployment=dep, devices=int(row["devices"]),
                   ttft_s=row["ttft_s"], tpot_s=row["tpot_s"], decode_step_s=row["decode_step_s"],
                   tokens_per_step=row["tokens_per_step"], decode_tokens_per_s=row["decode_tokens_per_s"],
                   decode_tokens_per_s_per_device=row["decode_tokens_per_s_per_device"],
                   prefill_tokens_per_s_per_device=row["prefill_tokens_per_s_per_device"],
                   weights_bytes_per_device=row["weights_bytes_per_device"],
                   kv_cache_bytes_per_device=row["kv_cache_bytes_per_device"], kv_location=location,
                   fits=bool(row["fits"]), limited_by=limited, reason=reason, kv_bytes_per_device=by_tier,
                   kv=kv, time_s=time_s, limits=limits, batching=batching, offline=offline)

    def summary_rows(self) -> list[tuple[str, str]]:
        t, kv = self.time_s, self.kv
        tiers = ", ".join(f"{tier} {fmt_bytes(v)}" for tier, v in self.kv_bytes_per_device.items() if v > 0)
        o = self.offline
        rows = [
            ("offline: output tokens/s", f"{fmt_rate(o['tokens_per_s'])} ({fmt_rate(o['tokens_per_s_per_device'])} per device"
                                         + (f"; published runs: {fmt_rate(o['tokens_per_s_per_device_low'])} to "
                                            f"{fmt_rate(o['tokens_per_s_per_device_high'])}"
                                            if o["tokens_per_s_per_device_low"] is not None else "") + ")"),
            ("offline: how far to trust it", o["band"]),
            ("offline: mean TTFT, TPOT", f"{fmt_seconds(o['ttft_s'])}, {fmt_seconds(o['tpot_s'])}"),
            ("offline: sequences in flight", f"{o['sequences']:,} per replica (the KV cache holds "
                                             f"{o['kv_sequences']:,}; max_batch_size "
                                             f"{o['max_batch_size']:,}), {o['waves']:,} wave"
                                             f"{'s' if o['waves'] != 1 else ''}, a step of at most "
                                             f"{o['step_tokens']:,} tokens"),
            ("offline: KV cache allocated", f"{fmt_bytes(o['kv_pool_bytes_per_device'])} per device"),
            ("offline: run time", fmt_seconds(o["makespan_s"])),
        ] if o else []
        if o and not self.fits:   # an engine whose KV cache holds no request does not start
            rows = [("offline: output tokens/s", "none: the run cannot start (see fits below)"),
                    ("offline: KV cache allocated", f"{fmt_bytes(o['kv_pool_bytes_per_device'])} per device")]
        rows += [
            ("time to first token", fmt_seconds(self.ttft_s)),
            ("time per output token", f"{fmt_seconds(self.tpot_s)} ({self.tokens_per_step:.3g} "
                                      f"token{'' if self.tokens_per_step == 1 else 's'} per "
                                      f"{fmt_seconds(self.decode_step_s)} step)"),
            ("decode tokens/s per device", f"{fmt_rate(self.decode_tokens_per_s_per_device)} "
                                           f"({fmt_rate(self.decode_tokens_per_s)} for all {self.devices}"
                                           + (f" and the {self.lender_devices} lending HBM to the pool"
                                              if self.lender_devices else "") + ")" + self._decode_band()),
            ("prefill tokens/s per device", fmt_rate(self.prefill_tokens_per_s_per_device)),
            ("weights per device", fmt_bytes(self.weights_bytes_per_device)),
            ("KV cache per device", f"{fmt_bytes(self.kv_cache_bytes_per_device)} "
                                    f"({fmt_bytes(kv['bytes_per_token'])} per token per sequence)"),
            ("KV cache lives in", f"{self.kv_location}" + (f" ({tiers})" if tiers else "")),
            ("KV read per step", f"{fmt_bytes(kv['read_bytes_per_step_per_device'])} per device in "
                                 f"{fmt_seconds(t['kv'])}, {fmt_seconds(kv['time_per_output_token_s'])} per "
                                 f"output token, {kv['spill_slowdown']:.3g}x its HBM time"),
            ("fits", ("yes" if self.fits else "NO") + f": {self.reason}"),
            ("how far to trust it", self.band),
            ("largest batch that fits", f"{self.limits['max_batch']:,} ({self.limits['max_batch_hbm']:,} in HBM)"),
            ("largest context at this batch", f"{self.limits['max_context']:,} tokens "
                                              f"({self.limits['max_context_hbm']:,} in HBM)"),
            ("limited by", self.limited_by),
            ("  step: weights read", fmt_seconds(t["weights"])),
            ("  step: attention (KV read or math)", fmt_seconds(t["attention"])),
            ("  step: element-wise kernels", fmt_seconds(t["elementwise"])),
            ("  step: kernels' fixed times", fmt_seconds(t["fixed"])),
            ("  step: sampling", fmt_seconds(t["sampling"])),
        ]
        if t["experts"] > 0:
            rows.append(("  step: routed experts", fmt_seconds(t["experts"])))
        for part, label in (("tp", "tensor-parallel all-reduces"), ("ep", "expert all-to-alls"),
                            ("pp", "pipeline sends")):
            if t[part] > 0:
                extra = f" (exposed {fmt_seconds(t['ep_exposed'])})" if part == "ep" else ""
                rows.append((f"  step: {label}", fmt_seconds(t[part]) + extra))
        b = self.batching
        rows.append(("continuous vs static batching", f"{fmt_rate(b['continuous_tokens_per_s_per_device'])} vs "
                     f"{fmt_rate(b['static_tokens_per_s_per_device'])} tokens/s per device "
                     f"({b['continuous_over_static']:.2f}x, prefill included)"))
        return rows + power_rows(self, "output token")

    def _decode_band(self) -> str:
        if not self.band_runs:
            return ""
        return (f"; published runs: {fmt_rate(self.decode_tokens_per_s_per_device_low)} to "
                f"{fmt_rate(self.decode_tokens_per_s_per_device_high)}")

    def deployment_text(self) -> str:
        """The deployment in one line: degrees, batch, lengths, precisions, drafts."""
        d = self.deployment
        plural = "s" if d["draft_tokens"] > 1 else ""
        spec = (f", {d['draft_tokens']} draft token{plural} at {d['acceptance']:.0%} acceptance"
                if d["draft_tokens"] else "")
        tbo = ", two-batch overlap" if d["microbatches"] == 2 else ""
        if d["scenario"] == "offline":
            return (f"tp={d['tp']} pp={d['pp']} dp={d['dp']} ep={d['ep']}, offline: {d['requests']:,} requests of "
                    f"{d['prompt_len']:,} + {d['output_len']:,} tokens, weights {d['weight_dtype']}, "
                    f"KV {d['kv_dtype']}{spec}{tbo}")
        return (f"tp={d['tp']} pp={d['pp']} dp={d['dp']} ep={d['ep']}, batch {d['batch']:,}, prompt "
                f"{d['prompt_len']:,} + output {d['output_len']:,} tokens, KV length {d['context']:,}, "
                f"weights {d['weight_dtype']}, KV {d['kv_dtype']}{spec}{tbo}")

    def headline(self) -> str:
        return (f"{self.model} on {self.system}, {self.devices} device{'s' if self.devices != 1 else ''}: "
                f"{self.deployment_text()}")


def _reason(system: System, g: dict, row: dict, by_tier: dict, offline: bool) -> str:
    """Why a deployment fits or does not: the weights, the KV cache, or where it lives."""
    if not row["fits_weights"] and offline:
        room = max(system.device.hbm_capacity - system.device.memory_reserve - g["engine_memory_bytes"], 0.0)
        reason = (f"weights need {fmt_bytes(row['weights_bytes_per_device'])} per device; "
                  f"{system.device.name} has {fmt_bytes(room)} after the runtime's reserve and the engine's "
                  f"{fmt_bytes(g['engine_memory_bytes'])} (engine_memory_bytes)")
    elif not row["fits_weights"]:
        reason = (f"weights need {fmt_bytes(row['weights_bytes_per_device'])} per device; "
                  f"{system.device.name} offers {fmt_bytes(g['hbm_utilization'] * system.device.hbm_capacity)} "
                  f"({g['hbm_utilization']:.0%} of HBM)")
    elif not row["fits"]:
        reason = (f"KV cache needs {fmt_bytes(row['kv_cache_bytes_per_device'])} per device; "
                  f"{fmt_bytes(row['kv_unplaced_bytes_per_device'])} finds no room in any tier")
        if offline:   # the engine sizes its cache in HBM only
            reason += (f" (the offline run keeps it in HBM: kv_fraction {g['kv_fraction']:g} of what the "
                       f"weights, the runtime's reserve and the engine's "
                       f"{fmt_bytes(g['engine_memory_bytes'])} (engine_memory_bytes) leave)")
    else:
        used = [f"{fmt_bytes(v)} {t}" for t, v in by_tier.items() if v > 0]
        reason = "KV cache in " + (", ".join(used) if used else "HBM (empty)")
    return reason
