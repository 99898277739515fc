"""Sweep machinery on a deterministic fake evaluate: list parsing, the grid, pool == serial, ranking, outputs."""
import json

import pyarrow.parquet as pq
import pytest

from tests.sim.study_synth import fake_evaluate

from rlsim.replay.errors import RlsimError  # noqa: E402
from rlsim.sweeps import backends
from rlsim.core import grid as grids
from rlsim.present import results
from rlsim.core.config import WhatIf  # noqa: E402

STUDY = {"prompts": 8, "group": 4}


def test_parse_list_types_and_errors():
    assert grids.parse_list("64,128, 256", int | None, "--batch") == [64, 128, 256]
    assert grids.parse_list("64,64,128", int, "--batch") == [64, 128]
    assert grids.parse_list("sqrt,fixed", str | None, "--lr-rule") == ["sqrt", "fixed"]
    assert grids.parse_list("none,8", int | None, "--group") == [None, 8]
    assert grids.parse_list("0.5,1e-3", float, "--x") == [0.5, 1e-3]
    with pytest.raises(RlsimError, match=r"--batch: empty element"):
        grids.parse_list("64,,x", int, "--batch")
    with pytest.raises(RlsimError, match=r"--batch: 'x' is not a valid value"):
        grids.parse_list("64,x", int, "--batch")
    with pytest.raises(RlsimError, match=r"--batch: '1.5' is not a valid value"):
        grids.parse_list("1.5", int, "--batch")
    with pytest.raises(RlsimError, match="empty list"):
        grids.parse_list("", int, "--batch")


def test_grid_is_the_cartesian_product_in_order():
    grid = grids.build_grid(WhatIf, {"prompts": [64, 128], "group": [4, 8, 16], "lr_rule": ["sqrt", "fixed"]})
    assert len(grid) == 12
    assert (grid[0].prompts, grid[0].group, grid[0].lr_rule) == (64, 4, "sqrt")
    assert (grid[1].prompts, grid[1].group, grid[1].lr_rule) == (64, 4, "fixed")
    assert (grid[-1].prompts, grid[-1].group, grid[-1].lr_rule) == (128, 16, "fixed")
    assert len({g for g in grid}) == 12


def test_grid_rejects_empty_and_invalid_configs():
    with pytest.raises(RlsimError, match="empty"):
        grids.build_grid(WhatIf, {"prompts": []})
    with pytest.raises(RlsimError, match=r"config \[--prompts 0\] is invalid: --prompts must be a positive integer"):
        grids.build_grid(WhatIf, {"prompts": [64, 0]}, labels={"prompts": "--prompts"})
    with pytest.raises(RlsimError, match="lr-rule"):
        grids.build_grid(WhatIf, {"lr_rule": ["sqrt", "cubic"]})


def _grid():
    return grids.build_grid(WhatIf, {"prompts": [4, 8, 16, 32, 64, 128, 256], "group": [4, 8],
                                     "lr_rule": ["sqrt", "fixed"]})


def test_pool_equals_serial_equals_single_evaluate():
    grid = _grid()
    serial = backends.run_sweep(STUDY, grid, workers=1, evaluate=fake_evaluate)
    seen = []
    pooled = backends.run_sweep(STUDY, grid, workers=2, chunk_size=3, evaluate=fake_evaluate, progress=seen.append)
    assert pooled == serial
    assert sum(seen) == len(grid) and len(seen) == -(-len(grid) // 3)
    for cfg, row in zip(grid, serial):
        assert row == {**grids.config_dict(cfg), **fake_evaluate(STUDY, cfg).to_dict()}


def test_ranking_best_first_with_grid_ids():
    grid = _grid()
    ranked = results.rank_rows(backends.run_sweep(STUDY, grid, workers=1, evaluate=fake_evaluate))
    ratios = [r["time_to_target_ratio"] for r in ranked]
    assert ratios == sorted(ratios)
    assert [r["rank"] for r in ranked] == list(range(1, len(grid) + 1))
    assert sorted(r["config_id"] for r in ranked) == list(range(len(grid)))
    nan_last = results.rank_rows([{"time_to_target_ratio": float("nan")}, {"time_to_target_ratio": 2.0},
                                  {"time_to_target_ratio": None}])
    assert [r["config_id"] for r in nan_last] == [1, 0, 2]


def test_results_files_carry_grid_and_trace_identity(tmp_path):
    class T:  # a stand-in trace with the attributes trace_identity reads
        path = tmp_path / "t.parquet"
        name = "t"
        recovered = False
        meta = {"config": {"prompts": 8, "group": 4}, "created": "x", "seed": 1}

    T.path.write_bytes(b"abc")
    grid = _grid()
    ranked = results.rank_rows(backends.run_sweep(STUDY, grid, workers=1, evaluate=fake_evaluate))
    axes = {"prompts": [4, 8, 16, 32, 64, 128, 256], "group": [4, 8], "lr_rule": ["sqrt", "fixed"]}
    meta = results.sweep_metadata(traces=[T], axes=axes, fixed={}, labels={"prompts": "--batch"}, n_configs=len(grid),
                             study_options={"rho_model": "auto", "target": None}, backend={"kind": "local"})
    out = tmp_path / "sweep"
    paths = results.write_results(out, ranked, meta)
    table = pq.read_table(paths["parquet"])
    kv = json.loads(table.schema.metadata[results.SWEEP_META_KEY])
    assert (kv["grid"]["axes"] == axes and kv["grid"]["n_configs"] == 28
            and kv["grid"]["options"]["prompts"] == "--batch")
    assert kv["traces"][0]["sha256"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert kv["traces"][0]["config"] == {"prompts": 8, "group": 4}
    assert json.loads(paths["json"].read_text()) == kv
    assert table.num_rows == 28 and table.column("rank").to_pylist() == list(range(1, 29))
    csv = paths["csv"].read_text().splitlines()
    assert len(csv) == 29 and csv[0].startswith('"rank","config_id"')
    rows, meta2 = results.read_results(out)
    assert meta2 == kv and rows[0]["time_to_target_ratio"] == ranked[0]["time_to_target_ratio"]
    assert json.loads(rows[-1]["warnings"]) in ([], ["extrapolating"])  # lists stored as JSON text


def test_output_folder_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "res"
    out.mkdir()
    (out / "results.csv").write_text("old")
    (out / "keep.txt").write_text("user file")
    with pytest.raises(RlsimError, match="already exists; pass --overwrite"):
        results.prepare_out_dir(out, False)
    results.prepare_out_dir(out, True)
    assert not (out / "results.csv").exists() and (out / "keep.txt").exists()
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(RlsimError, match="not a folder"):
        results.prepare_out_dir(f, True)


def test_ray_missing_says_how_to_install(without_ray):
    with pytest.raises(RlsimError) as e:
        backends.run_sweep(STUDY, _grid(), ray_address="auto", evaluate=fake_evaluate)
    assert str(e.value) == "--ray-address needs Ray, an optional extra: pip install 'rlsim[ray]'"
