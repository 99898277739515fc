"""`rlsim run --device/--gpus` on a CPU trace names the trace's own host (its metadata's processor), and says when that
host's figures are not measured."""
from __future__ import annotations

import pytest

from rlsim.core.config import WhatIf
from rlsim.replay.io import read_trace
from rlsim.replay.measured_hosts import HOSTS
from rlsim.replay.synthetic import SynthSpec, synthetic_trace
from rlsim.whatif.predict import evaluate
from rlsim.whatif.study import prepare

XEON = "Intel(R) Xeon(R) Processor @ 2.80GHz"


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    d = tmp_path_factory.mktemp("hosts")
    measured = next(iter(HOSTS.values()))[0]
    out = {}
    for name, proc in (("xeon", XEON), ("measured", measured)):
        hw = {"cpu_name": proc, "device_name": proc, "cpu_cores": 2, "torch_threads": 2}
        path = synthetic_trace(d / f"{name}.parquet", SynthSpec(prompts=8, group=4, steps=6, max_num_seqs=16),
                               meta_overrides={"hardware": hw})
        out[name] = prepare([read_trace(path)])
    return out


def test_an_unmeasured_host_is_named_and_its_stand_in_figures_are_warned_about(studies):
    o = evaluate(studies["xeon"], WhatIf(prompts=16, device="h200", gpus=8, updates=4))
    assert any(n.startswith("rescaled from 2 x Intel Xeon (host CPU; not measured") for n in o.notes), o.notes
    assert any("the CPU host Intel Xeon has no measured figures" in w for w in o.warnings), o.warnings
    measured = next(iter(HOSTS.values()))[0]
    assert not any(n.startswith(f"rescaled from 2 x {measured}") for n in o.notes)


def test_a_measured_host_is_named_as_measured(studies):
    measured = next(iter(HOSTS.values()))[0]
    o = evaluate(studies["measured"], WhatIf(prompts=16, device="h200", gpus=8, updates=4))
    assert any(n.startswith(f"rescaled from 2 x {measured} (host CPU; measured)") for n in o.notes), o.notes
    assert not any("no measured figures" in w for w in o.warnings)


def test_more_of_the_recorded_cpu_names_it_by_vendor_and_model(studies):
    o = evaluate(studies["xeon"], WhatIf(prompts=16, gpus=4, updates=4))
    assert o.hardware == "4 x Intel Xeon"
    assert any("4 x the recorded device (Intel Xeon)" in n for n in o.notes)
    assert not any("no measured figures" in w for w in o.warnings)  # the same device: no figure is used
