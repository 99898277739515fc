"""A CPU trace's host is named from its own metadata: the measured figures of that processor when
`rlsim.replay.measured_hosts` holds them, else an unmeasured host named after its processor whose stand-in figures
are stated, never another host's figures under that host's name."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rlsim.replay.devices as devices
from rlsim.replay.devices import (HOST_PROFILES, host_identity, host_name, host_profile, profile_by_name,
                                  profile_for_hardware)
from rlsim.replay.fit import fit_trace
from rlsim.replay.io import read_trace
from rlsim.replay.measured_hosts import HOSTS
from rlsim.replay.synthetic import synthetic_trace
from rlsim.runner.summary import summarize

XEON = "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz"  # no measured entry (checked below)


@pytest.mark.parametrize("raw, name", [
    ("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "Intel Xeon Platinum 8375C"),
    ("Intel(R) Xeon(R) Processor @ 2.80GHz", "Intel Xeon"),
    ("Intel(R) Xeon(R) Processor", "Intel Xeon"),
    ("AMD EPYC 7B13 64-Core Processor", "AMD EPYC 7B13"),
    ("Intel(R) Core(TM) i7-10700 CPU @ 2.90GHz", "Intel Core i7-10700"),
    ("  Apple   M2 Pro ", "Apple M2 Pro"),
    (None, ""),
])
def test_a_processor_is_named_by_vendor_and_model(raw, name):
    assert host_name(raw) == name and host_identity(raw) == name.lower()


def test_a_measured_host_gets_its_own_figures_under_its_name():
    ident, (proc, _cores, bw, fl, mem, src) = next(iter(HOSTS.items()))
    p = profile_for_hardware({"device": "cpu", "cpu_name": proc, "device_name": proc})
    assert p is HOST_PROFILES[p.key] and p.aliases == (ident,) and not p.stand_in
    assert (p.mem_bandwidth_gbs, p.flops_tflops, p.memory_gb, p.interconnect_gbs) == (bw, fl, mem, bw)
    assert p.name.startswith(proc) and "measured" in p.name and p.source == src
    assert profile_by_name(proc) is p
    assert devices.get_profile(p.key) is p  # a measured host is also a --device


def test_an_unmeasured_host_is_named_after_its_processor_and_says_whose_figures_stand_in():
    assert host_identity(XEON) not in HOSTS
    p = profile_for_hardware({"device": "cpu", "cpu_name": XEON, "device_name": XEON, "cpu_cores": 2})
    assert p.key == "cpu-intel-xeon-platinum-8375c" and p.key not in devices.PROFILES
    assert p.name.startswith("Intel Xeon Platinum 8375C (host CPU; not measured")
    others = [h.processor for h in HOST_PROFILES.values()]
    assert all(o in p.stand_in and o in p.name for o in others)
    assert "python -m bench.device_profile --write" in p.stand_in and "not measured" in p.source
    # a name that merely contains a measured processor's words, or the word CPU, is not that host
    ident = next(iter(HOSTS))
    assert profile_by_name(HOSTS[ident][0] + " 7763") is None
    assert profile_by_name("Intel(R) Xeon(R) CPU E5-2680") is None
    # it is found again from what a rescale writes about it, with the same figures
    again = profile_for_hardware(p.to_dict())
    assert (again.key, again.mem_bandwidth_gbs, again.flops_tflops) == (p.key, p.mem_bandwidth_gbs, p.flops_tflops)


def test_an_unmeasured_hosts_recorded_bandwidth_is_its_own():
    p = host_profile({"device": "cpu", "cpu_name": XEON, "mem_bandwidth_gbs": 55.0})
    assert p.mem_bandwidth_gbs == p.interconnect_gbs == 55.0
    assert "FLOP/s and memory stand in" in p.stand_in and "memory bandwidth" not in p.stand_in
    assert "bandwidth from the trace's metadata" in p.source


def test_several_measured_hosts_stand_in_by_their_median(monkeypatch):
    made = {"a": ("Alpha One", 2, 10.0, 0.1, 8.0, "m"), "b": ("Beta Two", 4, 30.0, 0.5, 16.0, "m"),
            "c": ("Gamma Three", 8, 20.0, 0.2, 32.0, "m")}
    hosts = [devices._measured_host(host_identity(v[0]), v) for v in made.values()]
    monkeypatch.setattr(devices, "HOST_PROFILES", {p.key: p for p in hosts})
    p = host_profile({"device": "cpu", "cpu_name": XEON})
    assert (p.mem_bandwidth_gbs, p.flops_tflops, p.memory_gb) == (20.0, 0.2, 16.0)
    assert "median of the measured hosts' (Alpha One, Beta Two, Gamma Three)" in p.stand_in
    assert host_profile({"device": "cpu", "cpu_name": "Beta Two"}).flops_tflops == 0.5
    monkeypatch.setattr(devices, "HOST_PROFILES", {})
    assert host_profile({"device": "cpu", "cpu_name": XEON}) is None  # nothing measured: nothing to stand in


def test_a_trace_that_names_no_processor_is_an_unnamed_host():
    p = profile_for_hardware({"device": "cpu"})
    assert p.key == "cpu-unnamed" and p.name.startswith("an unnamed CPU (host CPU; not measured")
    assert p.stand_in.startswith("the trace's CPU host, unnamed in its hardware metadata, has no measured figures")
    assert profile_for_hardware({}) is None and profile_for_hardware(None) is None  # no hardware at all: no profile


def test_rescaling_names_the_traces_host_and_warns_about_stand_in_figures(tmp_path):
    def rescaled(hw):
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}.parquet"
        t = read_trace(synthetic_trace(path, meta_overrides={"hardware": hw}))
        return devices.rescale(fit_trace(t), "h200", 8, source_profile=t.meta["hardware"], source_gpus=2)

    out, notes = rescaled({"cpu_name": XEON, "device_name": XEON})
    assert notes[0].startswith("rescaled from 2 x Intel Xeon Platinum 8375C (host CPU; not measured")
    assert any("the CPU host Intel Xeon Platinum 8375C has no measured figures" in w for w in out.warnings)
    assert out.config["rescaled_from"]["cpu_name"] == XEON and "profile" not in out.config["rescaled_from"]
    proc = next(iter(HOSTS.values()))[0]
    out, notes = rescaled({"cpu_name": proc, "device_name": proc})
    assert notes[0].startswith(f"rescaled from 2 x {proc} (host CPU; measured)")
    assert not any("no measured figures" in w for w in out.warnings)
    assert out.config["rescaled_from"]["profile"] == host_profile({"cpu_name": proc}).key


def test_the_bench_writes_a_host_under_its_processors_identity(tmp_path):
    from bench.device_profile import write_host

    path = tmp_path / "measured_hosts.py"
    path.write_text((Path(devices.__file__).parent / "measured_hosts.py").read_text())

    def hosts() -> dict:
        return ast.literal_eval(path.read_text().split("HOSTS: dict[str, tuple] = ", 1)[1])

    before = hosts()
    assert write_host(XEON, 2, 30.04, 0.2, 24.0, path) == "intel xeon platinum 8375c"
    got = hosts()
    assert {k: v for k, v in got.items() if k in before} == before  # others kept
    assert got["intel xeon platinum 8375c"][:5] == ("Intel Xeon Platinum 8375C", 2, 30.0, 0.2, 24.0)
    write_host("Intel(R) Xeon(R) Platinum 8375C CPU @ 3.50GHz", 4, 31.0, 0.3, 24.0, path)  # the same processor again
    got = hosts()
    assert len(got) == len(before) + 1 and got["intel xeon platinum 8375c"][1:3] == (4, 31.0)


def test_inspect_names_the_profile_a_cpu_trace_rescales_by(tmp_path):
    proc = next(iter(HOSTS.values()))[0]
    for name, hw, says in (("xeon", {"cpu_name": XEON, "device_name": XEON}, "(not measured: "),
                           ("measured", {"cpu_name": proc, "device_name": proc}, "(measured")):
        path = synthetic_trace(tmp_path / f"{name}.parquet", meta_overrides={"hardware": hw})
        line = next(s for s in summarize(str(path)).splitlines() if s.startswith("hardware"))
        key = host_profile(hw).key
        assert f"; device profile {key} {says}" in line, line
