"""The fourth wall through the library: formulas, presets, planners, results, search by
what the user pays for, the command line, and the invariants power must keep."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import snlab
from snlab import energy, presets
from snlab.cli import main
from snlab.errors import SnlabError
from snlab.walls import power as pw

SYSTEMS = presets.names("system")


# --- formulas ----------------------------------------------------------------------------

def test_device_power_formula_by_hand():
    v = dict(tdp=700.0, idle_power=100.0, compute_activity=0.5, memory_activity=0.5, hbm_energy=1e-10,
             memory_efficiency=1.0, memory_bandwidth=2e12, link_energy=0.0, inner_efficiency=1.0,
             inner_bandwidth=1e11, link_activity=0.0)
    assert pw.device_power(**v) == pytest.approx(100 + 300 + 100)
    assert pw.device_power(**dict(v, compute_activity=1.0)) == 700.0      # held to the TDP
    assert float(pw.device_power.subs(**v)) == pytest.approx(500.0)


def test_thermal_clock_branches():
    base = dict(rack_power_limit=32e3, rack_devices=32.0, overhead_power=100.0, idle_power=100.0, tdp=900.0)
    assert pw.thermal_clock(**base) == 1.0                                # 1000 W allowed, 900 drawn
    assert pw.thermal_clock(**dict(base, rack_power_limit=16e3)) == pytest.approx(300 / 800)
    assert pw.thermal_clock(**dict(base, rack_power_limit=3e3)) == 0.0    # not even idle


def test_cost_formulas_by_hand():
    rate = pw.cost_rate(devices=2.0, device_price=1e-3, capex=0.0, lifetime=1.0, fleet_utilisation=0.5,
                        energy_price=1e-7, facility_power=1e4)
    assert rate == pytest.approx(2 * 1e-3 / 0.5 + 1e-3)
    assert pw.cost_per_token(cost_rate=rate, throughput=100.0) == pytest.approx(rate / 100)
    assert pw.facility_power(pue=1.3, it_power=1e5) == pytest.approx(1.3e5)
    assert pw.energy_per_token(power=700.0, throughput=7000.0) == pytest.approx(0.1)


def test_the_fourth_wall_is_listed_with_the_others():
    names = snlab.walls.formulas()
    for name in ("device_power", "overhead_power", "it_power", "facility_power", "energy_per_token", "cost_rate",
                 "cost_per_token", "thermal_clock"):
        assert names[name] is getattr(pw, name)


# --- presets -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SYSTEMS)
def test_every_shipped_system_has_a_sourced_power_model(name):
    s = presets.system(name)
    assert s.has_power and s.cooling_kind in s.cooling
    assert 0 < s.device.idle_power < s.device.tdp and s.device.hbm_energy > 0
    bib = presets.bibliography()
    for key, prov in s.provenance.items():
        if key.startswith(("power.", "cooling.")):
            assert prov.source in bib, key
    for key in ("power.tdp", "power.idle_power", "power.hbm_energy"):
        assert s.device.provenance[key].source in bib, key
    # the built-for cooling sets the clock the device preset measured
    assert snlab.energy.cooled(s, s.cooling_kind) is s


def test_power_sections_are_checked_on_load(tmp_path):
    text = presets.to_toml(presets.device("h100-sxm-80gb"))
    bad = tmp_path / "hot.toml"
    bad.write_text(text.replace('idle_power = { value = 130, unit = "W"', 'idle_power = { value = 800, unit = "W"'))
    with pytest.raises(SnlabError, match="idle_power"):
        presets.device(str(bad))
    system = presets.to_toml(presets.system("dgx-h100"))
    wrong = tmp_path / "wet.toml"
    wrong.write_text(system.replace('kind = "air"', 'kind = "water"', 1))
    with pytest.raises(SnlabError, match="cooling.kind"):
        presets.system(str(wrong))
    pue = tmp_path / "pue.toml"
    pue.write_text(system.replace("value = 1.56", "value = 0.9", 1))
    with pytest.raises(SnlabError, match="pue.*a PUE from 1 to 3"):
        presets.system(str(pue))


def test_a_system_without_power_plans_without_power_columns(tmp_path):
    text = presets.to_toml(presets.system("dgx-h100"))
    bare = text.split("\n[power]")[0] + "\n"
    path = tmp_path / "bare.toml"
    path.write_text(bare)
    r = snlab.train("llama3-8b", str(path), tp=8, global_batch=8)
    assert r.device_power_w is None and r.power == {}
    assert "device_power_w" not in snlab.sweep("llama3-8b", str(path), tp=8, global_batch=[8, 16]).columns
    with pytest.raises(SnlabError, match="cooling: .* has no power model"):
        snlab.train("llama3-8b", str(path), tp=8, global_batch=8, cooling="air")


def test_full_load_of_the_reference_racks_against_their_published_figures():
    """The done criterion: within 20% of NVIDIA's 120 kW for an NVL72 rack and of
    SemiAnalysis's 559 kW for a CloudMatrix384 supernode (sources in the presets)."""
    assert abs(energy.full_load("gb200-nvl72")["it_power_w"] / 120e3 - 1) <= 0.20
    assert abs(energy.full_load("cloudmatrix384")["it_power_w"] / 559e3 - 1) <= 0.20
    assert energy.full_load("cloudmatrix384")["racks"] == 16


# --- planners and results --------------------------------------------------------------

@pytest.mark.parametrize("name", SYSTEMS)
def test_every_shipped_system_gives_power_and_energy(name):
    s = presets.system(name)
    tp = min(8, s.devices_per_node)
    r = snlab.train("llama3-8b", name, tp=tp, global_batch=8)
    d = r.to_dict()
    for key in ("device_power_w", "it_power_w", "facility_power_w", "energy_per_token_j"):
        assert d[key] > 0 and np.isfinite(d[key]), key
    assert d["facility_power_w"] >= d["it_power_w"] >= r.devices * d["device_power_w"]
    assert d["cost_per_million_tokens_usd"] is None
    assert r.device_power_w <= s.device.tdp
    served = snlab.serve("llama3-8b", name, tp=tp, batch=8, prompt_len=500, output_len=100)
    assert served.energy_per_token_j > served.power["device_energy_per_token_j"] > 0
    json.dumps(d, allow_nan=False)


def test_prices_add_cost_and_scale_it():
    kw = dict(tp=8, global_batch=64)
    rent = snlab.train("llama3-8b", "dgx-h100", prices={"device_hour": 2.0}, **kw)
    double = snlab.train("llama3-8b", "dgx-h100", prices={"device_hour": 4.0}, **kw)
    assert double.cost_per_million_tokens_usd == pytest.approx(2 * rent.cost_per_million_tokens_usd)
    # 8 devices at 2 $/h over the tokens of an hour
    assert rent.cost_per_million_tokens_usd == pytest.approx(16 / (rent.tokens_per_s * 3600) * 1e6)
    half = snlab.train("llama3-8b", "dgx-h100", prices={"device_hour": 2.0, "utilisation": 0.5}, **kw)
    assert half.cost_per_million_tokens_usd == pytest.approx(2 * rent.cost_per_million_tokens_usd)
    power = snlab.train("llama3-8b", "dgx-h100", prices={"kwh": 0.1}, **kw)
    assert power.power["cost_per_hour_usd"] == pytest.approx(power.facility_power_w / 1e3 * 0.1)
    assert rent.cost_to_train_usd(1e9) == pytest.approx(1e3 * rent.cost_per_million_tokens_usd)
    assert rent.energy_to_train_j(1e9) == pytest.approx(1e9 * rent.energy_per_token_j)
    example = snlab.train("llama3-8b", "dgx-h100", prices="example", **kw)
    assert example.power["prices"]["device_hour"] == 2.5


def test_pue_and_cooling_change_what_they_should():
    kw = dict(tp=8, global_batch=64)
    base = snlab.train("llama3-8b", "dgx-h100", **kw)
    low = snlab.train("llama3-8b", "dgx-h100", pue=1.1, **kw)
    assert low.it_power_w == pytest.approx(base.it_power_w)
    assert low.facility_power_w == pytest.approx(1.1 * base.it_power_w)
    liquid = snlab.train("llama3-8b", "dgx-h100", cooling="liquid", **kw)
    assert liquid.cooling == "liquid" and liquid.power["pue"] == 1.15
    assert liquid.step_time_s == pytest.approx(base.step_time_s)          # no throttling either way
    cm = snlab.train("llama3-70b", "cloudmatrix384", tp=8, pp=4, dp=4, global_batch=512)
    air = snlab.train("llama3-70b", "cloudmatrix384", tp=8, pp=4, dp=4, global_batch=512, cooling="air")
    assert air.step_time_s > 1.2 * cm.step_time_s and air.power["sustained_clock"] < 0.8
    # the user's clock wins over the cooling's
    own = snlab.train("llama3-70b", "cloudmatrix384", tp=8, pp=4, dp=4, global_batch=512, cooling="air",
                      sustained_clock=1.0)
    assert own.step_time_s == pytest.approx(cm.step_time_s)
    with pytest.raises(SnlabError, match="cooling: air cooling removes 30 kW per rack"):
        snlab.train("llama3-8b", "gb200-nvl72", tp=8, global_batch=8, cooling="air")


@pytest.mark.parametrize("bad, match", [
    (dict(cooling="water"), "cooling: got 'water'"), (dict(pue=0.9), "pue: got 0.9"),
    (dict(prices={"kwh": -1}), "prices.kwh: got -1"), (dict(prices={"dollars": 1}), "prices.dollars: no such price"),
    (dict(prices={}), "prices: no price given"), (dict(prices="cheap"), "prices: got 'cheap'"),
    (dict(prices={"device_hour": 0}), "prices: device_hour, capex and kwh are all 0"),
    (dict(prices={"device_hour": 1, "utilisation": 0}), "prices.utilisation"),
    (dict(prices={"capex": 1e5, "years": 100}), "prices.years"),
])
def test_bad_power_inputs_are_one_line_errors(bad, match):
    with pytest.raises(SnlabError, match=match) as info:
        snlab.train("llama3-8b", "dgx-h100", tp=8, global_batch=8, **bad)
    assert "\n" not in str(info.value)


def test_sweep_has_power_columns_with_units():
    df = snlab.sweep("llama3-8b", ["dgx-h100", "cloudmatrix384"], tp=8, global_batch=[8, 64],
                     prices={"device_hour": 2.0})
    for col in energy.POWER_COLUMNS + energy.COST_COLUMNS:
        assert col in df.columns and df[col].notna().all(), col
    assert (df["facility_power_w"] >= df["it_power_w"]).all()
    serve = snlab.serve_sweep("llama3-8b", "dgx-h100", tp=1, batch=[8, 64], prompt_len=500, output_len=100)
    assert {"device_power_w", "energy_per_token_j", "racks"} <= set(serve.columns)
    assert serve.set_index("batch")["energy_per_token_j"].is_monotonic_decreasing


def test_search_by_what_the_user_pays_for():
    kw = dict(devices=64, global_batch=512, tp=[4, 8])
    fast = snlab.search("llama3-70b", "dgx-h100", **kw)
    frugal = snlab.search("llama3-70b", "dgx-h100", objective="tokens_per_joule", **kw)
    cheap = snlab.search("llama3-70b", "dgx-h100", objective="tokens_per_dollar", prices={"kwh": 0.1}, **kw)
    assert fast["step_time_s"].is_monotonic_increasing
    assert frugal["energy_per_token_j"].is_monotonic_increasing
    assert cheap["cost_per_million_tokens_usd"].is_monotonic_increasing
    assert frugal.iloc[0]["energy_per_token_j"] <= fast.iloc[0]["energy_per_token_j"]
    # with electricity the only price, the cheapest plan is the one drawing the least energy
    assert cheap.iloc[0]["energy_per_token_j"] == pytest.approx(frugal.iloc[0]["energy_per_token_j"])
    budget = 0.99 * fast.iloc[0]["facility_power_w"]
    held = snlab.search("llama3-70b", "dgx-h100", power_budget=budget, **kw)
    assert (held["facility_power_w"] <= budget).all()
    assert snlab.search("llama3-70b", "dgx-h100", power_budget="1 kW", **kw).empty
    with pytest.raises(SnlabError, match="prices: missing for objective tokens_per_dollar"):
        snlab.search("llama3-70b", "dgx-h100", objective="tokens_per_dollar", **kw)
    with pytest.raises(SnlabError, match="objective: got 'speed'"):
        snlab.search("llama3-70b", "dgx-h100", objective="speed", **kw)
    with pytest.raises(SnlabError, match="power_budget"):
        snlab.search("llama3-70b", "dgx-h100", power_budget="-5 MW", **kw)


# --- invariants ----------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(uc=st.floats(0, 1), um=st.floats(0, 1), ul=st.floats(0, 1), more=st.floats(0, 1))
def test_more_activity_never_draws_less_and_never_beyond_the_limit(uc, um, ul, more):
    hw = snlab.hardware.hardware(snlab.system("dgx-h100"))
    p = energy.device_power(hw, (uc, um, ul))
    assert hw.idle_power <= p <= hw.tdp
    assert energy.device_power(hw, (min(1, uc + more), um, ul)) >= p
    assert energy.device_power(hw, (uc, min(1, um + more), ul)) >= p


@settings(max_examples=15, deadline=None)
@given(kwh=st.floats(0.01, 1.0), pue=st.floats(1.0, 3.0))
def test_energy_and_cost_grow_with_pue_and_price(kwh, pue):
    kw = dict(tp=8, global_batch=64)
    a = snlab.train("llama3-8b", "dgx-h100", pue=pue, prices={"kwh": kwh}, **kw)
    b = snlab.train("llama3-8b", "dgx-h100", pue=min(3.0, pue * 1.1), prices={"kwh": kwh * 1.1}, **kw)
    assert b.energy_per_token_j >= a.energy_per_token_j and b.cost_per_million_tokens_usd > a.cost_per_million_tokens_usd
    assert a.energy_per_token_j == pytest.approx(pue * a.power["it_energy_per_token_j"])


# --- command line -----------------------------------------------------------------------------

def _json(args, capsys):
    main(args)
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", SYSTEMS)
def test_train_and_serve_json_give_power_on_every_shipped_system(name, capsys):
    tp = str(min(8, presets.system(name).devices_per_node))
    t = _json(["train", "--model", "llama3-8b", "--system", name, "--tp", tp, "--global-batch", "8", "--json"], capsys)
    s = _json(["serve", "--model", "llama3-8b", "--system", name, "--tp", tp, "--prompt-len", "500",
               "--output-len", "100", "--batch", "8", "--json"], capsys)
    for out in (t, s):
        assert out["it_power_w"] > 0 and out["facility_power_w"] > out["it_power_w"] and out["energy_per_token_j"] > 0
        assert out["cost_per_million_tokens_usd"] is None


def test_json_gives_cost_with_prices(capsys):
    t = _json(["train", "--model", "llama3-8b", "--system", "dgx-h100", "--tp", "8", "--global-batch", "8",
               "--capex", "50000", "--kwh-price", "0.08", "--tokens", "1e9", "--json"], capsys)
    assert t["cost_per_million_tokens_usd"] > 0 and t["cost_to_train_usd"] == pytest.approx(
        1e3 * t["cost_per_million_tokens_usd"])
    assert t["energy_to_train_j"] == pytest.approx(1e9 * t["energy_per_token_j"])
    s = _json(["serve", "--model", "llama3-8b", "--system", "dgx-h100", "--prompt-len", "500", "--output-len", "100",
               "--prices", "example", "--json"], capsys)
    assert s["cost_per_million_tokens_usd"] > 0
    found = _json(["search", "--model", "llama3-8b", "--system", "dgx-h100", "--devices", "8", "--global-batch",
                   "64", "--objective", "tokens_per_joule", "--top", "2", "--json"], capsys)
    assert found[0]["energy_per_token_j"] <= found[1]["energy_per_token_j"]


@pytest.mark.parametrize("flags, message", [
    (["--cooling", "water"], "argument --cooling: invalid choice"),
    (["--pue", "5"], "pue: got '5' (allowed: a PUE from 1 to 3)"),
    (["--kwh-price", "x"], "kwh_price: got 'x'"),
    (["--prices", "example", "--kwh-price", "0.1"], "prices: --prices example with kwh"),
    (["--years", "4"], "prices: no price given"),
    (["--device-hour-price", "0"], "prices: device_hour, capex and kwh are all 0"),
    (["--cooling", "air", "--system-x"], "unrecognized arguments"),
])
def test_cli_power_flags_fail_in_one_line(flags, message, capsys):
    assert _status(["train", "--model", "llama3-8b", "--system", "gb200-nvl72", "--tp", "8", "--global-batch",
                    "8"] + flags) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def _status(args) -> int:
    """The exit status of the command: argparse's errors exit, snlab's return."""
    try:
        return main(args)
    except SystemExit as exc:
        return exc.code


def test_cli_power_budget_and_an_impossible_cooling(capsys):
    assert _status(["train", "--model", "llama3-8b", "--system", "gb200-nvl72", "--tp", "8", "--global-batch", "8",
                    "--cooling", "air"]) == 2
    assert "cooling: air cooling removes 30 kW per rack" in capsys.readouterr().err
    assert _status(["search", "--model", "llama3-8b", "--system", "dgx-h100", "--devices", "8", "--global-batch", "64",
                    "--power-budget", "lots"]) == 2
    assert "power_budget: got 'lots'" in capsys.readouterr().err


def test_a_job_table_gives_the_energy_and_cost_of_the_run():
    frame = snlab.search("llama3-8b", "dgx-h100", devices=64, global_batch=512, top=1, prices={"device_hour": 2.0})
    job = snlab.compare.with_job(frame, 1e12)
    assert job["energy_to_train_j"].iloc[0] == pytest.approx(1e12 * frame["energy_per_token_j"].iloc[0])
    # 64 devices at 2 $/h for the hours the run takes
    assert job["cost_to_train_usd"].iloc[0] == pytest.approx(job["device_hours"].iloc[0] * 2.0)


def test_the_example_prices_carry_their_date_and_source_and_say_they_are_examples():
    from snlab.presets import read_toml
    from snlab.presets.loader import DATA
    text = (DATA / "prices.toml").read_text()
    assert "NOT quotes" in text
    bib = presets.bibliography()
    for table in ("device_hour", "capex", "kwh"):
        for name, entry in read_toml(DATA / "prices.toml", "prices.toml")[table].items():
            assert entry["value"] > 0 and entry["date"] and entry["source"] in bib, (table, name)
    for name in ("dgx-h100", "gb200-nvl72", "cloudmatrix384", "pcie-ethernet-a100"):
        assert energy.example_prices(name, rent=False).capex > 0
    with pytest.raises(SnlabError, match="no example rent for ascend-910c"):
        energy.example_prices("cloudmatrix384", rent=True)



@pytest.mark.parametrize("bad", [5, True, 2.5, [1, 2], b"x"])
def test_prices_that_are_no_mapping_name_the_field(bad):
    for call in (snlab.train, snlab.sweep):
        with pytest.raises(SnlabError, match=r"^prices: got "):
            call("llama3-70b", "dgx-h100", tp=8, pp=4, dp=2, global_batch=64, prices=bad)
