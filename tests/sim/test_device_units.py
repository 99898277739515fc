"""Split what-ifs in device units: a CPU's device is a core, each replica and trainer rank holds one device, and the
reference runs colocated on as many devices as the split holds."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlsim.core.config import WhatIf
from rlsim.replay.io import read_trace
from rlsim.whatif.predict import evaluate
from rlsim.whatif.study import models_for, prepare, recorded_devices, reference_config

TRACE = Path(__file__).resolve().parents[2] / "traces" / "grpo_p32.parquet"
SPLIT = WhatIf(gen_gpus=1, train_gpus=1, staleness=1, updates=5)


@pytest.fixture(scope="module")
def study():
    return prepare([read_trace(TRACE)])


def test_a_cpu_trace_counts_its_cores(study):
    assert study.hardware["device"] == "cpu"
    assert recorded_devices(study) == int(study.hardware["torch_threads"])
    # 1 + 1 cores on a 2-core recording: the recorded machine, so the reference is the trace as recorded
    if recorded_devices(study) == 2:
        assert reference_config(study, SPLIT).gpus is None
    assert reference_config(study, dataclasses.replace(SPLIT, gen_gpus=3, train_gpus=1)).gpus == 4


def test_each_side_gets_one_devices_costs(study):
    m, _, notes = models_for(study, SPLIT)
    if study.device_models is not None:  # the run's costs at one core's measured speed
        assert m is study.device_models and "one core" in notes[0]
        r = m.config["one_device"]
        assert m.update.predict(1e4) == pytest.approx(study.models.update.predict(1e4) * r["train"])
        assert m.gen.c_seq == pytest.approx(study.models.gen.c_seq * r["gen"])
    elif recorded_devices(study) > 1:  # the recorded costs scaled to one device
        assert m is not study.models and m.update.predict(1e4) > study.models.update.predict(1e4)
    colocated, _, _ = models_for(study, WhatIf(updates=5))
    assert colocated is study.models
    if study.device_models is not None:  # and the answer says so
        assert any("one device's costs" in n for n in evaluate(study, SPLIT).notes)
