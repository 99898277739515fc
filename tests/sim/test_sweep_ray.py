"""The same sweep as Ray tasks on a local Ray instance gives results identical to the local pool."""

import pytest

from tests.sim.study_synth import make_trace

from rlsim.replay.io import read_trace
from rlsim.sweeps import backends
from rlsim.core import grid as grids
from rlsim.core.config import WhatIf
from rlsim.whatif.study import prepare

# rlsim imports ray only where a sweep runs on it: the module imports above need no ray
ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


def test_ray_results_identical_to_local(tmp_path, local_ray):
    traces = [read_trace(make_trace(tmp_path / "t.parquet", prompts=8, group=4, updates=5))]
    grid = grids.build_grid(WhatIf, {"prompts": [4, 8, 16, 32], "group": [2, 4, 8], "lr_rule": ["sqrt", "fixed"],
                                     "updates": [5]})
    study = prepare(traces)
    local = backends.run_sweep(study, grid, workers=2)
    seen = []
    remote = backends.run_sweep(study, grid, ray_address="local", chunk_size=5, progress=seen.append)
    assert backends.same_rows(remote, local)
    assert sum(seen) == len(grid) and len(seen) == -(-len(grid) // 5)  # several configs per task
