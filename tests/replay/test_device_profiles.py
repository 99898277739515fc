"""Datasheet device profiles: the new accelerators resolve by key, alias and real device-name strings, and
substring collisions (h20 inside h200, b200 inside gb200, l20 beside l40) go to the longest match."""
from __future__ import annotations

import pytest

from rlsim.replay.device_data import DEVICES
from rlsim.replay.devices import PROFILES, get_profile, profile_by_name, profile_for_hardware
from rlsim.replay.errors import RlsimError

# key: the names torch.cuda.get_device_name() (or nvidia-smi) gives for it, and names passed as --device
NEW = {
    "h20": (["NVIDIA H20"], ["h20", "H20", "h20-96gb", "HGX H20"]),
    "h800": (["NVIDIA H800", "NVIDIA H800 80GB HBM3"], ["h800", "H800", "h800-sxm", "h800 80GB"]),
    "a800-80gb": (["NVIDIA A800-SXM4-80GB"], ["a800-80gb", "A800-SXM4-80GB", "a800 80gb", "a800_80"]),
    "l20": (["NVIDIA L20"], ["l20", "L20", "l20 48gb"]),
    "gb200": (["NVIDIA GB200"], ["gb200", "GB200", "gb200-nvl72", "GB200 NVL72", "gb200 186gb"]),
}


@pytest.mark.parametrize("key", sorted(NEW))
def test_new_profile_resolves_by_key_alias_and_device_name(key):
    names, ids = NEW[key]
    assert key in DEVICES and PROFILES[key].kind == "gpu"
    for n in ids:
        assert get_profile(n).key == key, n
    for n in names:
        assert profile_by_name(n).key == key, n
        assert profile_for_hardware({"device": "cuda", "device_name": n}).key == key, n


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H200", "h200"),                       # "h20" is inside "h200": the longer alias wins
    ("NVIDIA H20", "h20"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA L40", "l40s"),
    ("NVIDIA L20", "l20"),
    ("NVIDIA B200", "b200"),                       # "b200" is inside "gb200": the longer key wins there
    ("NVIDIA GB200", "gb200"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA A800-SXM4-80GB", "a800-80gb"),
])
def test_substring_collisions_resolve_to_the_longest_match(name, key):
    assert profile_by_name(name).key == key


def test_unprofiled_variants_resolve_to_none_not_to_a_wrong_profile():
    # no A800 40GB datasheet: no bare "a800" alias, so the 40GB part is not given the 80GB numbers
    assert profile_by_name("NVIDIA A800-SXM4-40GB") is None
    assert profile_by_name("Tesla T4") is None
    with pytest.raises(RlsimError):
        get_profile("a800")


def test_every_datasheet_entry_is_sourced_and_positive():
    for key, (name, bw, fl, mem, ic, kind, aliases, src) in DEVICES.items():
        assert isinstance(src, str) and src.strip(), key
        assert name and kind in ("gpu", "cpu"), key
        assert all(isinstance(v, float) and v > 0 for v in (bw, fl, mem, ic)), key
        assert isinstance(aliases, tuple) and all(isinstance(a, str) and a for a in aliases), key


def test_aliases_are_unambiguous():
    # no key or alias (normalized as get_profile does) belongs to two profiles
    seen: dict[str, str] = {}
    for p in PROFILES.values():
        for a in (p.key, *p.aliases):
            n = " ".join(a.lower().replace("_", " ").replace("-", " ").split())
            assert seen.setdefault(n, p.key) == p.key, (n, seen[n], p.key)


@pytest.mark.parametrize("key", sorted(NEW))
def test_ridge_point_is_plausible(key):
    p = PROFILES[key]
    ridge = p.flops_tflops * 1e12 / (p.mem_bandwidth_gbs * 1e9)  # FLOP per byte at which the roofline bends
    assert 10 < ridge < 1000, (key, ridge)


def test_new_figures_match_their_sources():
    # the datasheet figures cited in rlsim.replay.device_data (dense bf16 = sparse figure halved where starred)
    want = {
        "h20": (4000.0, 148.0, 96.0, 900.0),
        "h800": (3350.0, 989.0, 80.0, 400.0),
        "a800-80gb": (2039.0, 312.0, 80.0, 400.0),
        "l20": (864.0, 119.5, 48.0, 64.0),
        "gb200": (8000.0, 2500.0, 186.0, 1800.0),
    }
    for key, (bw, fl, mem, ic) in want.items():
        p = PROFILES[key]
        assert (p.mem_bandwidth_gbs, p.flops_tflops, p.memory_gb, p.interconnect_gbs) == (bw, fl, mem, ic), key
    # the export variants keep their parent's compute and memory and differ in NVLink only
    assert PROFILES["h800"].flops_tflops == PROFILES["h100-sxm"].flops_tflops
    assert PROFILES["h800"].mem_bandwidth_gbs == PROFILES["h100-sxm"].mem_bandwidth_gbs
    assert PROFILES["a800-80gb"].flops_tflops == PROFILES["a100-80gb"].flops_tflops
    assert PROFILES["a800-80gb"].mem_bandwidth_gbs == PROFILES["a100-80gb"].mem_bandwidth_gbs
    assert PROFILES["h800"].interconnect_gbs < PROFILES["h100-sxm"].interconnect_gbs
    assert PROFILES["a800-80gb"].interconnect_gbs < PROFILES["a100-80gb"].interconnect_gbs
    # GB200 NVL72 rack totals over 72 GPUs: 13.4 TB HBM3e, 576 TB/s
    assert PROFILES["gb200"].memory_gb == pytest.approx(13400 / 72, abs=0.5)
    assert PROFILES["gb200"].mem_bandwidth_gbs == pytest.approx(576000 / 72)
