"""The power step's parts pinned by hand: activity from a step's columns, device power,
per-device overheads, IT and facility power, energy and cost per token, racks, and what
a kind of cooling does to a rack (``snlab.energy``, ``snlab.power_cooling``).

Each case uses round numbers whose result is worked out in the comment beside it, so a
changed term in the code changes a number here (tests/mutate.py checks that it does).
"""

import numpy as np
import pytest

import snlab
from snlab import energy
from snlab.errors import SnlabError
from snlab.hardware import hardware
from snlab.power_cooling import MIN_CLOCK, NO_CAP, cooled, cooling_state
from snlab.specs import Cooling, SystemPower


def _hw(**changes):
    base = dict(gemm_efficiency=0.5, sustained_clock=0.8, peak_flops=1e15, memory_efficiency=0.5,
                hbm_bandwidth=2e12, tdp=700.0, idle_power=100.0, hbm_energy=2e-10, link_energy=4e-10,
                scale_up_efficiency=0.5, scale_up_bandwidth=4e11, power_cap=NO_CAP, host_power=800.0,
                devices_per_node=8.0, switch_power=640.0, scale_up_domain_size=16.0, network_power=20.0,
                pue=1.5, devices_per_rack=32.0, network_racks=0.0)
    base.update(changes)
    return hardware(snlab.system("dgx-h100")).replace(**base)


def _train_out(**changes):
    out = dict(step_time_s=10.0, hardware_tflops_per_device=200.0, time_compute_s=7.0, time_optimizer_s=1.0,
               time_tp_s=1.0, time_ep_s=0.5, time_cp_s=0.25, time_pp_s=0.125, time_dp_s=2.0, time_zero_s=0.0625)
    out.update(changes)
    return out


def test_training_activity():
    hw = _hw()
    # FLOPs at 0.5 x 0.8 x 1e15 = 4e14 FLOP/s: 200e12 x 10 s / 4e14 = 5 s of the 10 s step
    uc, um, ul = energy.training_activity(_train_out(), hw, False)
    assert uc == pytest.approx(0.5)
    # the compute kernels' 7 s less the 5 s of FLOPs, and the 1 s optimizer on the device
    assert um == pytest.approx(0.3)
    # every collective: 1 + 0.5 + 0.25 + 0.125 + 2 + 0.0625 = 3.9375 s
    assert ul == pytest.approx(0.39375)
    # the optimizer on the host streams host DRAM, not HBM
    assert energy.training_activity(_train_out(), hw, True)[1] == pytest.approx(0.2)


def test_training_activity_is_a_fraction_of_the_step():
    hw = _hw()
    # compute kernels shorter than the FLOPs at the GEMM rate: no memory time below zero
    uc, um, ul = energy.training_activity(_train_out(time_compute_s=4.5, time_optimizer_s=0.0), hw, False)
    assert um == 0.0
    # FLOPs beyond the step and communication longer than it are held to the whole step
    uc, um, ul = energy.training_activity(_train_out(hardware_tflops_per_device=500.0, time_dp_s=20.0), hw, False)
    assert uc == 1.0 and ul == 1.0


def test_decode_activity():
    out = dict(decode_step_s=0.02, wall_compute_s=0.005, wall_memory_s=0.012, time_tp_s=0.002, time_ep_s=0.001,
               time_pp_s=0.0005)
    uc, um, ul = energy.decode_activity(out)
    assert (uc, um) == (pytest.approx(0.25), pytest.approx(0.6))
    assert ul == pytest.approx(0.175)          # (2 + 1 + 0.5) ms of 20 ms


def test_prefill_activity():
    hw = _hw()
    out = dict(ttft_s=0.5, devices=4.0, lender_devices=4.0, prefill_tokens_per_s_per_device=1000.0,
               weights_bytes_per_device=1e11, prefill_time_tp_s=0.1, prefill_time_ep_s=0.05)
    dep = dict(efficiency_ratio=0.5, gemm_ratio=2.0, pp=2.0)
    uc, um, ul = energy.prefill_activity(out, dep, hw, 8e10)
    # each working device makes 1000 x (4 + 4) / 4 = 2000 tokens/s of 8e10 FLOPs at
    # 0.5 x 0.5 x 0.8 x 1e15 x 2 = 4e14 FLOP/s
    assert uc == pytest.approx(0.4)
    # its weights once per stage pass: 1e11 B at 0.5 x 2e12 B/s = 0.1 s of 0.5 s / 2 stages
    assert um == pytest.approx(0.4)
    assert ul == pytest.approx(0.3)            # (0.1 + 0.05) s of 0.5 s


def test_device_power():
    hw = _hw()
    # 100 + 600 x 0.5 + 2e-10 x 0.5 x 2e12 x 0.25 + 4e-10 x 0.5 x 4e11 x 0.5 = 100 + 300 + 50 + 40
    assert energy.device_power(hw, (0.5, 0.25, 0.5)) == pytest.approx(490.0)
    # never above the TDP, nor above what the rack's cooling allows
    assert energy.device_power(hw, (1.0, 1.0, 1.0)) == pytest.approx(700.0)
    assert energy.device_power(_hw(power_cap=400.0), (1.0, 0.0, 0.0)) == pytest.approx(400.0)
    # a cap that holds the device below its TDP also shrinks the compute term's headroom
    assert energy.device_power(_hw(power_cap=400.0), (0.5, 0.0, 0.0)) == pytest.approx(250.0)


def test_overhead():
    # 800 W per 8-device node + 640 W per 16-device domain + 20 W = 100 + 40 + 20
    assert energy.overhead(_hw()) == pytest.approx(160.0)


def test_power_columns_by_hand():
    hw = _hw()
    cols = energy.power_columns(64.0, 500.0, 1000.0, hw, (0.5, 0.25, 0.125))
    assert cols["device_power_w"] == 500.0
    assert cols["it_power_w"] == pytest.approx(64 * 660.0)                 # 64 x (500 + 160)
    assert cols["facility_power_w"] == pytest.approx(1.5 * 64 * 660.0)
    assert cols["device_energy_per_token_j"] == pytest.approx(32.0)        # 32 kW / 1000 tokens/s
    assert cols["it_energy_per_token_j"] == pytest.approx(42.24)
    assert cols["energy_per_token_j"] == pytest.approx(63.36)
    assert cols["tokens_per_joule"] == pytest.approx(1 / 63.36)
    assert cols["racks"] == 2 and cols["pue"] == 1.5
    assert (cols["activity_compute"], cols["activity_memory"], cols["activity_links"]) == (0.5, 0.25, 0.125)
    assert "cost_per_hour_usd" not in cols
    # a PUE given replaces the cooling's
    assert energy.power_columns(64.0, 500.0, 1000.0, hw, (0, 0, 0), pue=1.2)["facility_power_w"] == \
        pytest.approx(1.2 * 64 * 660.0)


def test_power_columns_count_lenders_and_switch_racks():
    hw = _hw(network_racks=4.0)
    cols = energy.power_columns(30.0, 500.0, 1000.0, hw, (0, 0, 0), idle_devices=10.0)
    # 30 x 500 W working, 10 lenders at 100 W idle, 40 x 160 W of overhead
    assert cols["it_power_w"] == pytest.approx(15000 + 1000 + 6400)
    assert cols["device_energy_per_token_j"] == pytest.approx(16.0)
    # 40 devices: 2 racks of 32 and 4 switch racks for each of the 3 domains of 16 they span
    assert cols["racks"] == 2 + 4 * 3
    # exactly a rack's devices take one rack, and exactly two domains two domains' switch racks
    assert energy.racks(32.0, _hw()) == 1 and energy.racks(32.0, _hw(network_racks=4.0)) == 1 + 4 * 2
    # one device a rack
    assert energy.racks(5.0, _hw(devices_per_rack=1.0)) == 5


def test_full_load_of_a_gb200_nvl72_rack():
    load = energy.full_load("gb200-nvl72")
    # 72 GPUs at 1,200 W, 18 trays of 600 W, the switch trays' 4.4 kW, 44 W of network per GPU
    assert load["device_power_w"] == 1200.0
    assert load["it_power_w"] == pytest.approx(72 * 1200 + 18 * 600 + 4400 + 72 * 44)
    assert load["facility_power_w"] == pytest.approx(1.15 * load["it_power_w"])
    assert (load["racks"], load["pue"]) == (1.0, 1.15)
    # eight DGX H100 at their rating, 44 W of network each, in two 40.8 kW air-cooled racks
    h100 = energy.full_load("dgx-h100", devices=64)
    assert h100["it_power_w"] == pytest.approx(8 * 10200 + 64 * 44) and h100["racks"] == 2.0


def test_cost_columns_by_hand():
    hw = _hw(pue=1.0)
    prices = energy.Prices(device_hour=3.6, capex=31557.6, years=1.0, kwh=0.36, utilisation=0.5)
    cols = energy.power_columns(10.0, 840.0, 100.0, hw, (0, 0, 0), prices)
    # per device and second: rent 1e-3 $ + purchase 31557.6 / (365.25 x 86400) = 1e-3 $, over a
    # half-used fleet: 10 x 2e-3 / 0.5 = 0.04 $/s; electricity 10 kW x 1e-7 $/J = 1e-3 $/s
    assert cols["cost_per_hour_usd"] == pytest.approx(0.041 * 3600)
    assert cols["cost_per_million_tokens_usd"] == pytest.approx(0.041 / 100 * 1e6)
    assert cols["tokens_per_dollar"] == pytest.approx(100 / 0.041)


def test_training_columns_read_the_offload_codes():
    hw = _hw()
    out = dict(_train_out(), devices=8.0, tokens_per_s=1000.0)
    memory = {code: energy.training_columns(out, {"offload": np.float64(code)}, hw)["activity_memory"]
              for code in (0, 1, 2, 3)}
    # optimizer offloaded (1) or both (3): the optimizer step leaves HBM
    assert memory == {0: pytest.approx(0.3), 1: pytest.approx(0.2), 2: pytest.approx(0.3), 3: pytest.approx(0.2)}


def test_serving_flops_per_token_of_llama3_8b():
    m = snlab.model("llama3-8b")
    # 2 per matmul weight, and 4 L a d_h = 4 x 32 x 32 x 128 per attended key over half the prompt
    expected = 2 * snlab.sizing.model_sizes(m).matmul_params + 4 * 32 * 32 * 128 * 500
    assert energy.serving_flops_per_token(m, 1000) == pytest.approx(expected)


def _serve_parts():
    out = dict(decode_step_s=0.02, wall_compute_s=0.005, wall_memory_s=0.012, time_tp_s=0.002, time_ep_s=0.0,
               time_pp_s=0.0, ttft_s=0.5, devices=4.0, lender_devices=0.0, prefill_tokens_per_s_per_device=1000.0,
               weights_bytes_per_device=1e11, prefill_time_tp_s=0.0, prefill_time_ep_s=0.0, tokens_per_step=2.0,
               continuous_tokens_per_s_per_device=100.0, offline_tokens_per_s=1000.0)
    dep = dict(batch=16.0, dp=2.0, prefill_batch=4.0, output_len=300.0, pp=1.0, prompt_len=1000.0,
               scenario=0.0, requests=100.0, efficiency_ratio=1.0, gemm_ratio=1.0)
    return out, dep


def test_serving_columns_weigh_prefill_and_decode_by_their_time():
    hw = _hw()
    out, dep = _serve_parts()
    m = snlab.model("llama3-8b")
    cols = energy.serving_columns(m, out, dep, hw)
    dec = energy.device_power(hw, energy.decode_activity(out))
    pre = energy.device_power(hw, energy.prefill_activity(out, dep, hw, energy.serving_flops_per_token(m, 1000.0)))
    # 8 sequences per replica prefilled 4 at a time in 0.5 s: 1 s; 300 tokens at 2 a 20 ms step: 3 s
    assert cols["device_power_w"] == pytest.approx(0.25 * pre + 0.75 * dec)
    assert dec != pre
    activity = [0.25 * p + 0.75 * d for p, d in zip(energy.prefill_activity(
        out, dep, hw, energy.serving_flops_per_token(m, 1000.0)), energy.decode_activity(out))]
    assert [cols[f"activity_{k}"] for k in ("compute", "memory", "links")] == pytest.approx(activity)
    # continuous batching: 100 tokens/s per device over the 4 devices
    assert cols["device_energy_per_token_j"] == pytest.approx(4 * cols["device_power_w"] / 400.0)
    # the offline scenario's rate on offline rows
    offline = energy.serving_columns(m, out, dict(dep, scenario=1.0), hw)
    assert offline["device_energy_per_token_j"] == pytest.approx(4 * cols["device_power_w"] / 1000.0)
    # offline, a replica left without a request (one request, two replicas) draws idle power
    alone = energy.serving_columns(m, out, dict(dep, scenario=1.0, requests=1.0), hw)
    assert alone["device_energy_per_token_j"] == pytest.approx((2 * cols["device_power_w"] + 2 * 100.0) / 1000.0)
    assert energy.serving_columns(m, out, dict(dep, scenario=1.0, requests=2.0), hw)["device_energy_per_token_j"] \
        == pytest.approx(offline["device_energy_per_token_j"])
    # the fixed scenario keeps every replica busy, whatever the requests field holds
    assert energy.serving_columns(m, out, dict(dep, requests=1.0), hw)["device_energy_per_token_j"] \
        == pytest.approx(cols["device_energy_per_token_j"])
    # lenders of pooled HBM count in the continuous rate (per device, theirs included) and idle
    lent = energy.serving_columns(m, dict(out, lender_devices=4.0), dep, hw)
    assert lent["device_energy_per_token_j"] == pytest.approx((4 * lent["device_power_w"] + 4 * 100.0) / 800.0)


# --- cooling -------------------------------------------------------------------------

def _system(limit_kw, split=True, racks=0, clock=0.0, per_rack=32):
    base = snlab.system("dgx-h100")
    dev = base.device.replace(tdp=700.0, idle_power=100.0)
    power = SystemPower(host_power=800.0, switch_power=640.0, network_power=20.0, devices_per_rack=per_rack,
                        network_racks=racks, rack_split=split)
    cools = {"air": Cooling("air", 1.5, limit_kw * 1e3, clock), "liquid": Cooling("liquid", 1.1, 1e6)}
    return base.replace(device=dev, power=power, cooling=cools, cooling_kind="liquid")


def test_rack_overhead_counts_switches_only_in_compute_racks():
    # switches in the rack (no switch racks): 800 / 8 + 640 / 8 (the domain is the node here)
    assert cooling_state(_system(100)).rack_full_power_w == pytest.approx(32 * (700 + 100 + 80))
    # switches in racks of their own: only the host's share
    assert cooling_state(_system(100, racks=2)).rack_full_power_w == pytest.approx(32 * (700 + 100))


def test_a_rack_that_takes_its_devices():
    state = cooling_state(_system(30, racks=2), "air")          # 32 x 800 W = 25.6 kW under 30
    assert state.pue == 1.5 and state.rack_power_limit_w == 30e3
    assert (state.devices_per_rack, state.sustained_clock, state.device_cap_w) == (32, 1, NO_CAP)
    full = cooling_state(_system(25.6, racks=2), "air")         # 32 x 800 W exactly
    assert (full.devices_per_rack, full.sustained_clock, full.device_cap_w) == (32, 1, NO_CAP)


def test_separate_servers_spread_over_more_racks():
    # 8-device nodes of 8 x 800 W = 6.4 kW: a 20 kW room takes 3 of the 4
    state = cooling_state(_system(20, racks=2), "air")
    assert (state.devices_per_rack, state.sustained_clock, state.device_cap_w) == (24, 1, NO_CAP)
    # a 10 kW room takes one node a rack, at full clock
    one = cooling_state(_system(10, racks=2), "air")
    assert (one.devices_per_rack, one.sustained_clock, one.device_cap_w) == (8, 1, NO_CAP)


def test_a_fixed_rack_throttles():
    state = cooling_state(_system(20, split=False, racks=2), "air")
    # each device may draw 20 kW / 32 - 100 W = 525 W: 425 of its 600 W of dynamic power
    assert state.devices_per_rack == 32
    assert state.device_cap_w == pytest.approx(525.0)
    assert state.sustained_clock == pytest.approx(425 / 600)
    # one node already too hot for the rack: the servers throttle, one node a rack
    node = cooling_state(_system(5, racks=2), "air")
    assert node.devices_per_rack == 8
    assert node.device_cap_w == pytest.approx(5000 / 8 - 100)
    assert node.sustained_clock == pytest.approx((625 - 100 - 100) / 600)


def test_a_measured_clock_wins_over_the_derived_one():
    assert cooling_state(_system(20, split=False, racks=2, clock=0.9), "air").sustained_clock == 0.9


def test_a_rack_that_cannot_hold_its_idle_devices_is_an_error():
    # 6.4 kW over 32 devices = 200 W each: exactly their idle and overhead, no clock left
    with pytest.raises(SnlabError, match="the 32 devices of a dgx-h100 rack draw 6.4 kW idle .*rack limit above "
                                         "25.6 kW"):
        cooling_state(_system(6.4, split=False, racks=2), "air")
    assert cooling_state(_system(6.4 + 32 * 600 * 2 * MIN_CLOCK / 1e3, split=False, racks=2), "air").sustained_clock \
        == pytest.approx(2 * MIN_CLOCK)


def test_cooled():
    s = _system(20, split=False, racks=2)
    assert cooled(s, None) is s and cooled(s, "liquid") is s
    air = cooled(s, "air")
    assert air.cooling_kind == "air" and air.device.sustained_clock == pytest.approx(425 / 600, abs=1e-6)
    kept = cooled(s, "air", keep_clock=True)
    assert kept.cooling_kind == "air" and kept.device.sustained_clock == s.device.sustained_clock
    with pytest.raises(SnlabError, match="cooling"):
        cooled(s, "water")
