"""The result of one training plan: JSON form, text table and Jupyter display."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import uncertainty
from ..result import Result
from ..units import fmt_joules, fmt_watts
from ..specs import Model, System
from ..units import fmt_bytes, fmt_seconds
from . import plan as pl

TIME_PARTS = ("compute", "recompute", "tp", "ep", "cp", "pp", "dp", "zero", "bubble", "optimizer", "offload",
              "contention")
EXPOSED = ("tp", "ep", "cp", "pp", "dp", "zero", "offload")
MEMORY_PARTS = ("weights", "grads", "optimizer", "activations", "buffers")


@dataclass(frozen=True)
class TrainResult(Result):
    """One training plan on one system: times, utilisation, memory, verdicts.

    Times are seconds per step; ``time_s`` holds the parts (``compute`` includes
    ``recompute``; communication parts are totals, ``exposed`` what the step sees).
    ``*_low`` / ``*_high`` bound the step time, MFU and throughput by the error band of
    published training runs on the same chip family (``band_runs`` of them, ``band`` in
    words); with no published runs they are None (null in JSON).
    """

    model: str
    system: str
    precision: str
    plan: dict
    devices: int
    step_time_s: float
    mfu: float
    hfu: float
    model_tflops_per_device: float
    palm_tflops_per_device: float
    hardware_tflops_per_device: float
    tokens_per_s: float
    tokens_per_s_per_device: float
    fits: bool
    limited_by: str
    reason: str
    time_s: dict = field(repr=False)
    memory_bytes_per_device: dict = field(repr=False)
    bubble_fraction: float = 0.0
    micro_batches: int = 1
    step_time_s_low: float | None = None
    step_time_s_high: float | None = None
    mfu_low: float | None = None
    mfu_high: float | None = None
    tokens_per_s_low: float | None = None
    tokens_per_s_high: float | None = None
    band_runs: int = 0
    validated: bool = False
    band: str = ""
    cooling: str = ""
    device_power_w: float | None = None
    it_power_w: float | None = None
    facility_power_w: float | None = None
    energy_per_token_j: float | None = None
    cost_per_million_tokens_usd: float | None = None
    power: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_row(cls, model: Model, system: System, precision: str, g: dict, labels: dict, row: dict,
                 prices=None):
        plan = {
            "tp": int(g["tp"]), "pp": int(g["pp"]), "dp": int(g["dp"]), "ep": int(g["ep"]), "cp": int(g["cp"]),
            "micro_batch": int(g["micro_batch"]), "global_batch": int(g["global_batch"]),
            "zero": int(g["zero"]), "recompute": pl.RECOMPUTE_NAMES[int(g["recompute"])],
            "sequence_parallel": bool(g["sequence_parallel"]), "interleave": int(g["interleave"]),
            "offload": list(pl.OFFLOAD)[int(g["offload"])], "seq_len": int(g["seq_len"]),
            "grad_bytes": int(g["grad_bytes"]), "flash_attention": bool(g["flash_attention"]),
            "overlap": {c: float(g[f"overlap_{c}"]) for c in pl.OVERLAP_CLASSES},
            "first_stage_layers": int(g["first_stage_layers"]), "last_stage_layers": int(g["last_stage_layers"]),
            "ep_dispatcher": list(pl.EP_DISPATCHERS)[int(g["ep_dispatcher"])],
            "capacity_factor": float(g["capacity_factor"]), "expert_imbalance": float(g["expert_imbalance"]),
            "fp8_activations": list(pl.FP8_ACTIVATIONS)[int(g["fp8_activations"])],
            "expert_tp": int(g["expert_tp"]) or int(g["tp"]), "logit_bytes": float(g["logit_bytes"]),
            "offload_layers": int(g["offload_layers"]), "fp8_params": bool(g["fp8_params"]),
            "slice": "x".join(f"{float(row[f'slice_{a}']):g}" for a in "xyz") if "slice_x" in row else "",
        }
        time_s = {p: float(row[f"time_{p}_s"]) for p in TIME_PARTS}
        time_s["exposed"] = {p: float(row[f"exposed_{p}_s"]) for p in EXPOSED}
        time_s["exposed_communication"] = float(row["exposed_comm_s"])
        memory = {p: float(row[f"memory_{p}_bytes"]) for p in MEMORY_PARTS}
        memory.update(total=float(row["memory_total_bytes"]), capacity=float(row["memory_capacity_bytes"]),
                      usable=float(row["memory_usable_bytes"]), headroom=float(row["memory_headroom_bytes"]),
                      offloaded=float(row["memory_offloaded_bytes"]))
        fits = bool(row["fits"])
        walls = {"compute": row["wall_compute_s"], "communication": row["wall_communication_s"],
                 "memory": row["wall_memory_s"]}
        band = uncertainty.band("training", system.device.family)
        step, mfu, tps = float(row["step_time_s"]), float(row["mfu"]), float(row["tokens_per_s"])
        bands = dict(zip(("step_time_s_low", "step_time_s_high"), band.time(step)))
        bands.update(zip(("mfu_low", "mfu_high"), band.speed(mfu)))
        bands.update(zip(("tokens_per_s_low", "tokens_per_s_high"), band.speed(tps)))
        covered = bool(uncertainty.validated(system.device.family, {
            "tp": [plan["tp"]], "pp": [plan["pp"]], "cp": [plan["cp"]], "ep": [plan["ep"]],
            "interleave": [plan["interleave"]], "dp": [plan["dp"]], "zero": [plan["zero"]],
            "recompute": [plan["recompute"]]}, precision)[0])
        return cls(**bands, band_runs=band.runs, band=band.describe() + ("" if covered or not band.runs else
                   "; this plan lies outside what they cover (a degree, ZeRO stage, recomputation or precision "
                   "no published run of this family used)"), validated=covered,
                   **power_fields(system, row, prices),
                   model=model.name, system=system.name, precision=precision, plan=plan,
                   devices=int(row["devices"]), step_time_s=float(row["step_time_s"]), mfu=float(row["mfu"]),
                   hfu=float(row["hfu"]), model_tflops_per_device=float(row["model_tflops_per_device"]),
                   palm_tflops_per_device=float(row["palm_tflops_per_device"]),
                   hardware_tflops_per_device=float(row["hardware_tflops_per_device"]),
                   tokens_per_s=float(row["tokens_per_s"]), tokens_per_s_per_device=float(row["tokens_per_s_per_device"]),
                   fits=fits,
                   limited_by="memory" if not fits else max(walls, key=walls.get),
                   reason=_reason(system, memory, fits, row), time_s=time_s, memory_bytes_per_device=memory,
                   bubble_fraction=float(row["bubble_fraction"]), micro_batches=int(round(row["micro_batches"])))

    def _time_band(self) -> str:
        if not self.band_runs:
            return ""
        return f" (published runs: {fmt_seconds(self.step_time_s_low)} to {fmt_seconds(self.step_time_s_high)})"

    def _mfu_band(self) -> str:
        return f" (MFU {self.mfu_low:.1%} to {self.mfu_high:.1%})" if self.band_runs else ""

    def time_to_train_s(self, tokens: float) -> float:
        """Seconds to train on ``tokens`` tokens at this throughput."""
        return float(tokens) / self.tokens_per_s

    def energy_to_train_j(self, tokens: float) -> float | None:
        """Facility energy [J] to train on ``tokens`` tokens (None without a power model)."""
        return None if self.energy_per_token_j is None else float(tokens) * self.energy_per_token_j

    def cost_to_train_usd(self, tokens: float) -> float | None:
        """What training on ``tokens`` tokens costs [$] (None without prices)."""
        return None if self.cost_per_million_tokens_usd is None else float(tokens) / 1e6 * self.cost_per_million_tokens_usd

    def headline(self) -> str:
        p = self.plan
        devices = f"{self.devices} device{'s' if self.devices != 1 else ''}"
        return (f"{self.model} on {self.system}: {devices} (tp={p['tp']} pp={p['pp']} dp={p['dp']} "
                f"ep={p['ep']} cp={p['cp']}), micro-batch {p['micro_batch']}, global batch {p['global_batch']}, "
                f"recompute {p['recompute']}, ZeRO {p['zero']}" + (f", slice {p['slice']}" if p.get("slice") else ""))

    def summary_rows(self) -> list[tuple[str, str]]:
        t = self.time_s
        rows = [
            ("step time", fmt_seconds(self.step_time_s) + self._time_band()),
            ("MFU / HFU", f"{self.mfu:.1%} / {self.hfu:.1%}" + self._mfu_band()),
            ("how far to trust it", self.band),
            ("TFLOP/s per device (model / hardware)",
             f"{self.model_tflops_per_device:.1f} / {self.hardware_tflops_per_device:.1f} "
             f"(model FLOPs with the attention scores in full, as PaLM counts them: "
             f"{self.palm_tflops_per_device:.1f})"),
            ("tokens per second", f"{self.tokens_per_s:,.0f} ({self.tokens_per_s_per_device:,.0f} per device)"),
            ("memory per device", f"{fmt_bytes(self.memory_bytes_per_device['total'])} "
                                  f"({'fits' if self.fits else 'does NOT fit'}: {self.reason})"),
            ("limited by", self.limited_by),
            ("compute (incl. recompute)", fmt_seconds(t["compute"])),
        ]
        for part, label in (("tp", "tensor-parallel comm"), ("ep", "expert all-to-all"), ("cp", "context-parallel comm"),
                            ("pp", "pipeline sends and handshakes"), ("dp", "data-parallel gradients and weights"),
                            ("zero", "ZeRO / FSDP per micro-batch"), ("offload", "offload")):
            if t[part] > 0:
                rows.append((label, f"{fmt_seconds(t[part])} (exposed {fmt_seconds(t['exposed'][part])})"))
        rows.append(("pipeline bubble", f"{fmt_seconds(t['bubble'])} ({self.bubble_fraction:.1%} of ideal)"))
        if t["contention"] > 0:
            rows.append(("compute lost to overlap contention", fmt_seconds(t["contention"])))
        rows.append(("optimizer step", fmt_seconds(t["optimizer"])))
        for part in MEMORY_PARTS:
            rows.append((f"  memory: {part}", fmt_bytes(self.memory_bytes_per_device[part])))
        return rows + power_rows(self, "training token")


def _reason(system: System, memory: dict, fits: bool, row: dict) -> str:
    if memory["total"] > memory["usable"]:
        return (f"needs {fmt_bytes(memory['total'])} per device; {system.device.name} has "
                f"{fmt_bytes(memory['usable'])} usable of {fmt_bytes(memory['capacity'])}")
    if not fits:
        return (f"offloads {fmt_bytes(memory['offloaded'])} per device; "
                f"{'the pool' if system.pool else 'host memory'} gives {fmt_bytes(row['offload_capacity_bytes'])}")
    return (f"uses {memory['total'] / memory['usable']:.0%} of the {fmt_bytes(memory['usable'])} usable "
            f"({fmt_bytes(memory['headroom'])} to spare)")


def power_fields(system: System, row: dict, prices=None) -> dict:
    """The power fields of a result from its row: headline numbers, and ``power`` with
    the activities, each level of power, energy per token and the racks (empty without a
    power model)."""
    if "device_power_w" not in row:
        return {}
    keys = ("activity_compute", "activity_memory", "activity_links", "device_power_w", "it_power_w",
            "facility_power_w", "device_energy_per_token_j", "it_energy_per_token_j", "energy_per_token_j",
            "tokens_per_joule", "pue")
    power = {k: float(row[k]) for k in keys}
    power.update(racks=int(row["racks"]), sustained_clock=float(system.device.sustained_clock))
    cost = None
    if "cost_per_million_tokens_usd" in row:
        cost = float(row["cost_per_million_tokens_usd"])
        power.update(cost_per_hour_usd=float(row["cost_per_hour_usd"]), cost_per_million_tokens_usd=cost,
                     tokens_per_dollar=float(row["tokens_per_dollar"]), prices=dict(vars(prices)))
    return dict(cooling=system.cooling_kind, device_power_w=power["device_power_w"], it_power_w=power["it_power_w"],
                facility_power_w=power["facility_power_w"], energy_per_token_j=power["energy_per_token_j"],
                cost_per_million_tokens_usd=cost, power=power)


def power_rows(result, token: str) -> list[tuple[str, str]]:
    """The power rows of a result's table (none without a power model)."""
    p = result.power
    if not p:
        return []
    rows = [("power per device", f"{fmt_watts(p['device_power_w'])} (compute {p['activity_compute']:.0%}, "
                                 f"HBM {p['activity_memory']:.0%}, links {p['activity_links']:.0%} of the time)"),
            ("IT power / facility power", f"{fmt_watts(p['it_power_w'])} / {fmt_watts(p['facility_power_w'])} "
                                          f"({result.cooling} cooling, PUE {p['pue']:.2f}, {p['racks']:,} "
                                          f"rack{'s' if p['racks'] != 1 else ''})"),
            (f"energy per {token}", f"{fmt_joules(p['energy_per_token_j'])} at the facility "
                                    f"({fmt_joules(p['device_energy_per_token_j'])} in the devices alone)")]
    if "cost_per_million_tokens_usd" in p:
        rows.append((f"cost per million {token}s", f"${p['cost_per_million_tokens_usd']:,.4g} "
                                                    f"(${p['cost_per_hour_usd']:,.0f} per hour)"))
    return rows
