"""Presets: the required names exist, every number has a source and a convention,
TOML round-trips, and bad files get errors that name the field and the range."""

import math
import re
from pathlib import Path

import pytest

import snlab
from snlab import presets
from snlab.errors import SnlabError, UnknownPresetError

REQUIRED = {
    "device": ["a100-sxm-80gb", "a100-pcie-80gb", "h100-sxm-80gb", "h100-pcie-80gb", "h200",
               "b200", "ascend-910b", "ascend-910c"],
    "system": ["pcie-ethernet-a100", "dgx-a100", "dgx-h100", "atlas-800t-a2", "cloudmatrix384",
               "gb200-nvl72"],
    "model": ["gpt3-175b", "megatron-1t", "llama3-8b", "llama3-70b", "llama3-405b", "deepseek-v3",
              "llama3.2-1b"],
}
ALL = [(kind, name) for kind in presets.KINDS for name in presets.names(kind)]


@pytest.mark.parametrize("kind", presets.KINDS)
def test_required_names_exist(kind):
    assert set(REQUIRED[kind]) <= set(presets.names(kind))


def test_names_are_unique_across_kinds():
    seen = [name for _, name in ALL]
    assert len(seen) == len(set(seen))


@pytest.mark.parametrize("kind, name", ALL)
def test_every_number_has_a_known_source(kind, name):
    """Each number's source is a key of the shipped bibliography, with title and url."""
    bib = presets.bibliography()
    obj = presets.load(kind, name)
    assert obj.provenance, "no numbers recorded"
    for field, prov in obj.provenance.items():
        assert prov.source in bib, f"{name}.{field}: source {prov.source!r} not in sources.toml"
        assert bib[prov.source].get("title") and bib[prov.source].get("url"), prov.source


@pytest.mark.parametrize("kind, name", [(k, n) for k, n in ALL if k in ("device", "system")])
def test_conventions_are_stated(kind, name):
    """Compute is dense; link bandwidths are per direction (PRIMER conventions)."""
    obj = presets.load(kind, name)
    for field, prov in obj.provenance.items():
        if field.startswith("compute."):
            assert "dense" in prov.convention, f"{name}.{field}"
        if field.endswith(".bandwidth") and not field.startswith("memory.") and not field.startswith("storage."):
            assert "per direction" in prov.convention, f"{name}.{field}"


@pytest.mark.parametrize("kind, name", [(k, n) for k, n in ALL if k in ("device", "system")])
def test_calibration_constants_are_justified(kind, name):
    obj = presets.load(kind, name)
    for field, prov in obj.provenance.items():
        if field.endswith(("efficiency", "latency", "sustained_clock")):
            assert prov.note or prov.where, f"{name}.{field} needs a note or a table/section"


def test_bibliography_entries_are_used_and_complete():
    bib = presets.bibliography()
    used = {p.source for kind, name in ALL for p in presets.load(kind, name).provenance.values()}
    for key, entry in bib.items():
        assert entry.get("title") and entry.get("url", "").startswith("http"), key
    assert used <= set(bib)


@pytest.mark.parametrize("kind, name", ALL)
def test_toml_round_trip(kind, name, tmp_path):
    obj = presets.load(kind, name)
    path = tmp_path / f"copy-of-{name}.toml"
    path.write_text(presets.to_toml(obj))
    again = presets.load(kind, str(path))
    assert again == obj
    assert dict(again.provenance) == dict(obj.provenance)


def test_system_with_edited_device_round_trips(tmp_path):
    sysm = snlab.system("dgx-a100")
    faster = sysm.replace(device=sysm.device.replace(hbm_bandwidth=3.0e12))
    path = tmp_path / "edited.toml"
    path.write_text(presets.to_toml(faster))
    assert presets.load("system", path) == faster


def test_units_are_si_inside():
    dev = snlab.device("h100-sxm-80gb")
    assert dev.peak("bf16") == pytest.approx(989e12, rel=0.01)
    assert dev.hbm_capacity == 81559 * 2**20      # nvidia-smi's 81559 MiB
    assert snlab.device("h200").hbm_capacity == 141 * 2**30       # NVIDIA's "141 GB" is GiB (nvidia-smi: 140.4 GiB)
    dgx = snlab.system("dgx-h100")
    assert dgx.scale_up.bandwidth == pytest.approx(450e9)
    assert dgx.scale_out.bandwidth == pytest.approx(50e9)     # 400 Gb/s
    cm = snlab.system("cloudmatrix384")
    assert cm.scale_up.domain_size == 384 and cm.pool is not None
    assert snlab.system("pcie-ethernet-a100").scale_out.bandwidth == pytest.approx(2 * 100e9 / 8 / 8)


def test_known_model_sizes():
    """Published totals: DeepSeek-V3 671 B total / 37 B active (report Sec. 1);
    Llama 3 8.03 B / 70.6 B / 405.9 B (model cards)."""
    ds = snlab.model("deepseek-v3")
    assert ds.params == pytest.approx(671e9, rel=0.005)
    assert ds.active_params == pytest.approx(37e9, rel=0.03)
    for name, n in [("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9), ("llama3-405b", 405.9e9)]:
        assert snlab.model(name).params == pytest.approx(n, rel=0.005), name
    assert snlab.model("megatron-1t").params == pytest.approx(1.008e12, rel=5e-4)


# --- bad input ------------------------------------------------------------------------

def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(UnknownPresetError) as err:
        snlab.system("dgx-z100")
    text = str(err.value)
    assert "dgx-z100" in text and "cloudmatrix384" in text and "dgx-a100" in text


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "user.toml"
    path.write_text(text)
    return str(path)


def _device_text(**fields) -> str:
    base = snlab.presets.to_toml(snlab.device("a100-sxm-80gb"))
    for key, value in fields.items():
        base = re.sub(rf"^{key} = .*$", f"{key} = {value}", base, flags=re.M)
    return base


@pytest.mark.parametrize("value, pattern", [
    ('"-80 GB"', r"memory\.hbm_capacity: got -8e\+10 \(allowed: a quantity from 1 MB to 10 PB\)"),
    ('"0 GB"', r"memory\.hbm_capacity: got 0 \(allowed: a quantity from 1 MB to 10 PB"),
    ('"1 kB"', r"memory\.hbm_capacity: got 1000 \(allowed: a quantity from 1 MB to 10 PB"),
    ("{ value = nan, unit = \"GB\", source = \"x\" }", r"memory\.hbm_capacity: got nan \(allowed: a finite number"),
    ('"80 GB/s"', r"memory\.hbm_capacity: unit 'GB/s' is not a unit of bytes \(allowed: B, kB"),
    ("80", r"memory\.hbm_capacity: 80 has no unit"),
])
def test_bad_numbers_name_field_and_range(tmp_path, value, pattern):
    path = _write(tmp_path, _device_text(hbm_capacity=value))
    with pytest.raises(SnlabError, match=pattern):
        snlab.device(path)


def test_efficiency_out_of_range(tmp_path):
    path = _write(tmp_path, _device_text(gemm_efficiency="1.5"))
    with pytest.raises(SnlabError, match=r"calibration\.gemm_efficiency: got 1\.5 \(allowed: a fraction from 0\.001 to 1\)"):
        snlab.device(path)


def test_missing_field(tmp_path):
    text = "\n".join(l for l in _device_text().splitlines() if not l.startswith("hbm_bandwidth"))
    with pytest.raises(SnlabError, match=r"memory\.hbm_bandwidth: missing \(allowed: a quantity from 1 MB/s to 1 PB/s"):
        snlab.device(_write(tmp_path, text))


def test_missing_source(tmp_path):
    text = _device_text(hbm_bandwidth='"2039 GB/s"')
    text = text.replace("[memory]", "[memory]")
    with pytest.raises(SnlabError, match=r"memory\.hbm_bandwidth: has no source"):
        snlab.device(_write(tmp_path, text))


def test_unknown_field_is_a_typo_not_ignored(tmp_path):
    text = _device_text().replace("[memory]\n", '[memory]\nhbm_capcity = { value = 1, unit = "GB", source = "x" }\n')
    with pytest.raises(SnlabError, match=r"memory\.hbm_capcity: unknown field \(allowed: hbm_bandwidth, hbm_capacity"):
        snlab.device(_write(tmp_path, text))


def test_malformed_toml_names_the_line(tmp_path):
    with pytest.raises(SnlabError, match=r"malformed TOML: .*line 2"):
        snlab.device(_write(tmp_path, 'kind = "device"\nname = \n'))


def test_wrong_kind(tmp_path):
    path = _write(tmp_path, presets.to_toml(snlab.model("llama3-8b")))
    with pytest.raises(SnlabError, match="is a model"):
        snlab.system(path)


def test_model_relations_are_checked(tmp_path):
    text = presets.to_toml(snlab.model("llama3-8b"))
    text = re.sub(r"^kv_heads = .*$", 'kv_heads = { value = 5, source = "x" }', text, flags=re.M)
    with pytest.raises(SnlabError, match=r"kv_heads: 5 does not divide heads = 32"):
        snlab.model(_write(tmp_path, text))


def test_replace_validates():
    with pytest.raises(SnlabError, match="hbm_bandwidth"):
        snlab.device("h100-sxm-80gb").replace(hbm_bandwidth=-1.0)
    with pytest.raises(SnlabError, match="no such field"):
        snlab.device("h100-sxm-80gb").replace(hbm_bandwith=1.0)
    assert math.isclose(snlab.system("dgx-h100").replace(scale_out_bandwidth=1e11).scale_out.bandwidth, 1e11)


def test_a_path_to_no_file_says_so(tmp_path):
    missing = tmp_path / "mine.toml"
    with pytest.raises(SnlabError, match=rf"^model: no file '{re.escape(str(missing))}'") as error:
        snlab.model(str(missing))
    assert not isinstance(error.value, UnknownPresetError)
    with pytest.raises(UnknownPresetError, match="unknown system preset 'dgx-h1000'"):
        snlab.system("dgx-h1000")
