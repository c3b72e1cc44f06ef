"""The power model against published power and energy measurements it was not fitted to.

``power_runs.toml`` beside this module holds two kinds of rows. ``[[calibration]]`` rows
are device-level measurements the one fitted constant comes from: one H100 decoding
Llama 3.1 8B alone (no communication), where the bytes and FLOPs of each output token
are known, so the power the device draws at a known compute and memory activity fixes
the HBM's energy per byte (:func:`calibrate_hbm_energy`). ``[[run]]`` rows are held back
and compared only with the model done: each says what it counts (``gpu``: the devices
alone, as NVML reads them; ``server``: a node at the wall; ``system``: a rack or
supernode's IT equipment; ``facility``: with the PUE), and each regime has one tolerance
(:data:`TOLERANCE`) that every row of it is held to; a row outside it says why in
``outside`` and is an expected failure of its test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import SnlabError
from .runs import HERE, read_runs

_REQUIRED = ("id", "source", "where", "counts", "kind", "model", "system", "metric", "measured", "gap")
_KEYS = set(_REQUIRED) | {"deployment", "note", "outside", "devices", "cooling"}
#: what a row may count
COUNTS = ("gpu", "server", "system", "facility")
#: one tolerance per regime: energy per output token of a serving run (GPU only); the
#: power of a rack or supernode with every device at its limit
TOLERANCE = {"serving energy per token": 0.25, "system power at full load": 0.20}
#: vLLM's step token budget in ML.ENERGY's configurations (max-num-batched-tokens)
VLLM_STEP_TOKENS = 8192


def regime(run: dict) -> str:
    return {"serve": "serving energy per token", "full_load": "system power at full load"}[run["kind"]]


def _read(path: str | Path | None = None) -> dict:
    from ..presets import read_toml
    path = Path(path) if path else HERE / "power_runs.toml"
    return read_toml(path, path.name)


def power_runs(path: str | Path | None = None) -> list[dict]:
    """The published power and energy runs (default: the shipped file), validated."""
    path = Path(path) if path else HERE / "power_runs.toml"
    runs = read_runs(path, _REQUIRED, _KEYS, "power_runs.toml")
    for run in runs:
        if run["counts"] not in COUNTS:
            raise SnlabError(f"{path.name}: run {run['id']}.counts", f"got {run['counts']!r}", ", ".join(COUNTS))
        if run["kind"] not in ("serve", "full_load"):
            raise SnlabError(f"{path.name}: run {run['id']}.kind", f"got {run['kind']!r}", "serve, full_load")
    return runs


def calibration_rows(path: str | Path | None = None) -> list[dict]:
    """The device-level measurements the HBM energy is fitted to."""
    return _read(path).get("calibration", [])


def calibrate_hbm_energy(path: str | Path | None = None, prompts=range(100, 2001, 10)) -> dict:
    """Fit the HBM's energy per byte on the calibration rows (one device each).

    Each row is one device decoding a model alone at batch B with measured power P and
    output rate X. Per output token it reads the weights over B and the KV cache of its
    context, and computes its decode FLOPs and its share of its prompt's prefill; at the
    rate X that is a compute activity u_c (FLOPs at the achievable rate) and a memory
    activity u_m (bytes at the achievable bandwidth). With the compute term held to the
    TDP's headroom over idle (a power-limited matrix multiply), P - idle - (TDP - idle)
    u_c = e_B eta_m B_mem u_m is fitted for e_B by least squares, jointly with the
    benchmark's mean prompt length, which ML.ENERGY does not publish (a grid over
    ``prompts``). Returns the energy per byte [J/byte], the prompt length [tokens], the
    HBM's dynamic power at full streaming [W] and each row's relative error."""
    from ..energy import serving_flops_per_token
    from ..presets import model as load_model
    from ..presets import system as load_system
    from ..sizing import forward_flops_per_token, kv_cache_bytes_per_token
    rows = calibration_rows(path)
    if not rows:
        raise SnlabError("calibration", "no [[calibration]] rows", "rows of one device decoding alone")
    best = None
    for prompt in prompts:
        a, y, pred_parts = [], [], []
        for row in rows:
            m, s = load_model(row["model"]), load_system(row["system"])
            dev = s.device
            out = row["output_len"]
            ctx = prompt + out / 2
            flops = (float(forward_flops_per_token(m, ctx))
                     + prompt / out * float(serving_flops_per_token(m, prompt)))
            bytes_ = 2.0 * m.params / row["batch"] + ctx * float(kv_cache_bytes_per_token(m, 2.0))
            x = row["tokens_per_s"]
            uc = x * flops / (dev.gemm_efficiency * dev.sustained_clock * dev.peak("bf16"))
            um = x * bytes_ / (dev.memory_efficiency * dev.hbm_bandwidth)
            a.append(um)
            y.append(row["power_w"] - dev.idle_power - (dev.tdp - dev.idle_power) * uc)
            pred_parts.append((dev, uc, um, row["power_w"]))
        a, y = np.asarray(a), np.asarray(y)
        p_mem = float(a @ y / (a @ a))
        residual = float(np.sum((y - p_mem * a) ** 2))
        if best is None or residual < best[0]:
            best = (residual, prompt, p_mem, pred_parts)
    _, prompt, p_mem, parts = best
    dev = parts[0][0]
    errors = [min(d.tdp, d.idle_power + (d.tdp - d.idle_power) * uc + p_mem * um) / p - 1 for d, uc, um, p in parts]
    return {"hbm_energy": p_mem / (dev.memory_efficiency * dev.hbm_bandwidth), "prompt_len": int(prompt),
            "hbm_power_w": p_mem, "errors": errors}


def _predict(run: dict):
    from ..energy import full_load
    from ..serving import serve
    if run["kind"] == "full_load":
        return full_load(run["system"], run.get("cooling"), run.get("devices"))[run["metric"]], None
    result = serve(run["model"], run["system"], **run["deployment"])
    return result.power[run["metric"]], result


def power_table(path: str | Path | None = None):
    """Predicted against measured for every power run: a pandas DataFrame with the
    relative error, whether it is within its regime's tolerance, what it counts, and the
    stated gap."""
    import pandas as pd
    rows = []
    for run in power_runs(path):
        predicted, result = _predict(run)
        error = predicted / run["measured"] - 1
        tolerance = TOLERANCE[regime(run)]
        rows.append({"id": run["id"], "source": run["source"], "where": run["where"], "counts": run["counts"],
                     "model": run["model"], "system": run["system"], "regime": regime(run), "metric": run["metric"],
                     "measured": run["measured"], "predicted": predicted, "error": error, "tolerance": tolerance,
                     "within": abs(error) <= tolerance,
                     "device_power_w": result.device_power_w if result is not None else np.nan,
                     "gap": run["gap"], "outside": run.get("outside", "")})
    return pd.DataFrame(rows)
