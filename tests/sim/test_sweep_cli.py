"""`rlsim sweep` and `rlsim export perfetto` end to end on a synthetic trace with the real simulator;
sweep rows equal single `evaluate` results; bad input is one line and exit 2."""
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tests.sim.study_synth import make_trace

from rlsim.replay.io import read_trace  # noqa: E402
from rlsim.present import perfetto as pf  # noqa: E402
from rlsim.sweeps import backends
from rlsim.core import grid as grids
from rlsim.present import results
from rlsim.cli import app  # noqa: E402
from rlsim.core.config import WhatIf  # noqa: E402
from rlsim.whatif.predict import evaluate, run  # noqa: E402
from rlsim.whatif.study import prepare

runner = CliRunner()


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    return make_trace(tmp_path_factory.mktemp("tr") / "grpo.parquet", prompts=8, group=4, updates=6, max_num_seqs=32)


def _invoke(args):
    return runner.invoke(app, [str(a) for a in args])


def test_sweep_cli_writes_ranked_results_equal_to_single_evaluate(trace_path, tmp_path):
    out = tmp_path / "sweep"
    res = _invoke(["sweep", "--trace", trace_path, "--batch", "4,8,16,64", "--group", "4,8", "--lr-rule", "sqrt,fixed",
                   "--updates", "8", "--out", out, "--workers", "2", "--no-charts"])
    assert res.exit_code == 0, res.output
    assert "Ranking by time to target" in res.output
    table = pq.read_table(out / "results.parquet")
    assert table.num_rows == 16
    meta = json.loads(table.schema.metadata[results.SWEEP_META_KEY])
    assert (meta["grid"]["axes"]
            == {"prompts": [4, 8, 16, 64], "group": [4, 8], "lr_rule": ["sqrt", "fixed"], "updates": [8]})
    assert meta["grid"]["options"]["prompts"] == "--prompts"
    ident = meta["traces"][0]
    assert ident["sha256"] == results.sha256_file(trace_path) and ident["config"]["prompts"] == 8
    assert json.loads((out / "sweep.json").read_text()) == meta
    rows = table.to_pylist()
    ratios = [r["time_to_target_ratio"] for r in rows]
    assert ratios == sorted(ratios)
    traces = [read_trace(trace_path)]
    for r in rows:
        cfg = WhatIf(prompts=r["prompts"], group=r["group"], lr_rule=r["lr_rule"], updates=8)
        res_run = run(traces, cfg)
        single = res_run.candidate.to_dict()  # what `rlsim run` computes for this config, with its warnings
        single["warnings"] = "; ".join(list(res_run.warnings) + list(res_run.candidate.warnings))
        for k, v in single.items():
            assert r[k] == v, (k, r[k], v)
    assert len((out / "results.csv").read_text().splitlines()) == 17


def test_sweep_local_pool_equals_in_process_and_single_evaluate(trace_path):
    traces = [read_trace(trace_path)]
    grid = grids.build_grid(WhatIf, {"prompts": [4, 8, 16, 32], "group": [2, 4, 8], "seed": [0, 1], "updates": [6]})
    study = prepare(traces)
    pooled = backends.run_sweep(study, grid, workers=2, chunk_size=5)
    assert backends.same_rows(pooled, backends.run_sweep(study, grid, workers=1))
    fresh = prepare(traces)  # its own reference simulations (the memo is per study)
    for cfg, row in zip(grid, pooled):
        assert row == {**grids.config_dict(cfg), **evaluate(fresh, cfg).to_dict()}


@pytest.mark.parametrize("args, message", [
    (["--batch", "64,,x"], "--prompts/--batch: empty element in the list"),
    (["--batch", "64,x"], "--prompts/--batch: 'x' is not a valid value"),
    (["--batch", ""], "--prompts/--batch: empty list"),
    (["--batch", "0,64"], "--prompts must be a positive integer"),
    (["--lr-rule", "sqrt,cubic"], "--lr-rule must be one of"),
    ([], "nothing to sweep"),
])
def test_sweep_bad_input_is_one_line_exit_2(trace_path, tmp_path, args, message):
    res = _invoke(["sweep", "--trace", trace_path, "--out", tmp_path / "o", *args])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in res.output
    assert not (tmp_path / "o").exists()


def test_sweep_rejects_a_grpo_group_of_one_before_running(trace_path, tmp_path):
    res = _invoke(["sweep", "--trace", trace_path, "--batch", "8,16", "--group", "1,4", "--out", tmp_path / "o"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
    assert "config [--prompts 8 --group 1" in res.output and "GRPO needs a group of at least 2" in res.output


def test_sweep_refuses_existing_output_unless_overwrite(trace_path, tmp_path):
    out = tmp_path / "exists"
    out.mkdir()
    res = _invoke(["sweep", "--trace", trace_path, "--batch", "8,16", "--updates", "4", "--out", out, "--no-charts"])
    assert res.exit_code == 2 and res.output.strip().count("\n") == 0
    assert "already exists; pass --overwrite" in res.output
    res = _invoke(["sweep", "--trace", trace_path, "--batch", "8,16", "--updates", "4", "--out", out, "--no-charts",
                   "--overwrite", "--workers", "1"])
    assert res.exit_code == 0, res.output
    assert (out / "results.parquet").exists()


def test_sweep_missing_trace_is_one_line(tmp_path):
    res = _invoke(["sweep", "--trace", tmp_path / "nope.parquet", "--batch", "8", "--out", tmp_path / "o"])
    assert res.exit_code == 2 and "trace not found" in res.output and len(res.output.strip().splitlines()) == 1


def test_ray_address_without_ray_says_how_to_install(trace_path, tmp_path, without_ray):
    res = _invoke(["sweep", "--trace", trace_path, "--batch", "8,16", "--out", tmp_path / "o", "--ray-address", "auto"])
    assert res.exit_code == 2
    assert res.output.strip() == "error: --ray-address needs Ray, an optional extra: pip install 'rlsim[ray]'"


def test_export_perfetto_recorded_cli(trace_path, tmp_path):
    out = tmp_path / "recorded.json"
    res = _invoke(["export", "perfetto", trace_path, "-o", out])
    assert res.exit_code == 0, res.output
    obj = json.loads(out.read_text())
    counts = pf.check_chrome_trace(obj)
    trace = read_trace(trace_path)
    assert all(counts[k] == trace.count(k) for k in ("gen_step", "response", "update", "sync", "eval"))
    res = _invoke(["export", "perfetto", trace_path, "-o", out])
    assert res.exit_code == 2 and "already exists" in res.output


def test_export_perfetto_simulated_has_the_recorded_lanes(trace_path, tmp_path):
    rec = pf.recorded_chrome_trace(read_trace(trace_path))
    out = tmp_path / "simulated.json"
    res = _invoke(["export", "perfetto", "--simulate", "--trace", trace_path, "--batch", "16", "--updates", "3", "-o",
                   out])
    assert res.exit_code == 0, res.output
    obj = json.loads(out.read_text())
    counts = pf.check_chrome_trace(obj)
    assert counts["update"] == counts["sync"] == counts["gen_round"] == counts["rl_step"] == 3
    assert counts["response"] == 3 * 16 * 4  # every simulated response on a slot track
    assert counts["gen_step"] > 0

    def lanes(o):
        procs = {e["pid"]: e["args"]["name"]
                 for e in o["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
        return {(procs[e["pid"]], e["args"]["name"].rstrip("0123456789 ")) for e in o["traceEvents"]
                if e["ph"] == "M" and e["name"] == "thread_name"}

    assert lanes(rec) - {("eval", "evals")} <= lanes(obj)
    names = {e["name"] for e in obj["traceEvents"] if e["ph"] == "C"}
    assert {"gen.running", "gen.kv_usage"} <= names


@pytest.mark.parametrize("args, message", [
    (["export", "perfetto", "-o", "x.json"], "give the trace to export"),
    (["export", "perfetto", "missing.parquet", "-o", "x.json"], "trace not found"),
    (["export", "perfetto", "--simulate", "-o", "x.json"], "give a trace with --trace"),
    (["export", "perfetto", "--simulate", "--trace", "T", "--batch", "8,16", "-o", "x.json"], "give one value here"),
])
def test_export_bad_input(trace_path, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    res = _invoke([str(trace_path) if a == "T" else a for a in args])
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1


def test_a_sweep_into_a_folder_another_sweep_is_writing_is_refused(trace_path, tmp_path):
    from rlsim.replay.util import exclusive

    out = tmp_path / "o"
    args = ["sweep", "--trace", trace_path, "--batch", "4,8", "--updates", "3", "--workers", "1", "--no-charts",
            "--out", out]
    assert _invoke(args).exit_code == 0
    before = (out / "results.csv").read_text()
    with exclusive(out):  # another sweep holds the folder (the lock is per open file: this process counts as another)
        res = _invoke(args[:-2] + ["--batch", "4,8,16", "--overwrite", "--out", out])
    assert (res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
            and "in use by another rlsim process" in res.output)
    assert (out / "results.csv").read_text() == before  # nothing of the first lost
    assert _invoke(args[:-2] + ["--batch", "4,8,16", "--overwrite", "--out", out]).exit_code == 0  # free again


def test_sweep_lr_aware_ranks_by_the_rule_and_rows_equal_run(trace_path, tmp_path):
    """The lr-aware rho takes each row's lr rule (a fixed lr is another rho than sqrt at the same batch), and a
    sweep row equals `rlsim run` of that configuration with the same constants."""
    out = tmp_path / "sweep"
    res = _invoke(["sweep", "--trace", trace_path, "--batch", "16,64", "--lr-rule", "sqrt,fixed", "--updates", "4",
                   "--rho", "lr-aware", "--bend-batch", "100", "--kappa", "0.4", "--out", out, "--no-charts"])
    assert res.exit_code == 0, res.output
    rows = pq.read_table(out / "results.parquet").to_pylist()
    assert {r["rho_model"] for r in rows} == {"lr-aware"}
    rho = {(r["prompts"], r["lr_rule"]): r["rho"] for r in rows}
    assert rho[(64, "sqrt")] != pytest.approx(rho[(64, "fixed")])
    one = run([read_trace(trace_path)], WhatIf(prompts=64, lr_rule="fixed", updates=4), rho_model="lr-aware:100,0.4")
    assert one.candidate.rho == pytest.approx(rho[(64, "fixed")])


def _render(renderable, width=80):
    from rich.console import Console

    con = Console(width=width, record=True, highlight=False)
    con.print(renderable)
    return con.export_text()


def test_sweep_table_prints_intervals_and_undecided():
    from rlsim.present.tables import ranking_table

    def row(rank, p, t, lo, hi, regime, warnings=""):
        return {"rank": rank, "prompts": p, "group": 8, "responses_per_update": 8 * p, "responses_per_s": 204.0,
                "responses_per_s_lo": 192.8, "responses_per_s_hi": 214.6, "sigma": 0.907, "sigma_lo": 0.863,
                "sigma_hi": 0.920, "rho": 0.739, "rho_lo": 0.694, "rho_hi": 0.807, "time_to_target_ratio": t,
                "time_to_target_ratio_lo": lo, "time_to_target_ratio_hi": hi, "regime": regime, "warnings": warnings}

    rows = [row(1, 64, 0.816, 0.759, 0.892, "time falls"), row(2, 96, 0.95, 0.85, 1.07, "undecided", "spans 1"),
            row(3, 1024, 4.3, float("nan"), None, "time rises")]
    text = _render(ranking_table(rows, ["prompts", "group"], labels={"prompts": "--batch"}))
    for s in ("0.76..0.89", "0.86..0.92", "0.69..0.81", "193..215", "undecided", "0.85..1.07"):
        assert s in text, s
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80  # fits a terminal, nothing cut
    assert ([ln.split()[0] for ln in text.splitlines() if ln.lstrip()[:1].isdigit() and len(ln.split()) > 5]
            == ["1", "2!", "3"])


@pytest.fixture(scope="module")
def calibrated_path(tmp_path_factory):
    from rlsim.replay.synthetic import SynthSpec, synthetic_trace

    spec = SynthSpec(prompts=16, group=4, steps=8, max_num_seqs=1024, c_step=2e-3, c_seq=1e-4, c_knee=2e-4, knee=200,
                     calibrate=True, noise=0.03)
    return synthetic_trace(tmp_path_factory.mktemp("cal") / "cal.parquet", spec)


def test_sweep_cli_prints_intervals_and_an_honest_verdict(calibrated_path, tmp_path):
    res = _invoke(["sweep", "--trace", calibrated_path, "--batch", "8,16,64", "--updates", "5", "--out", tmp_path / "o",
                   "--workers", "1", "--no-charts"])
    assert res.exit_code == 0, res.output
    rows, meta = results.read_results(tmp_path / "o")
    ranged = [r for r in rows if r["time_to_target_ratio_hi"] > r["time_to_target_ratio_lo"]]
    assert ranged
    for r in ranged:  # each T interval under its value
        assert f"{r['time_to_target_ratio_lo']:.2f}..{r['time_to_target_ratio_hi']:.2f}" in res.output
    out = " ".join(res.output.split())
    assert "best:" not in out  # the old one-line "best: ... (T ratio, regime)"
    assert sum(s in out for s in ("Best of 3 configs", "Undecided", "No config beats the reference")) == 1
    assert "note: intervals: 90% bootstrap" in out
    for w in meta.get("warnings", []):  # the study's warnings, each once, whole
        assert out.count(" ".join(w.split())) == 1


def test_sweep_verdict_without_intervals_says_so():
    """Rows with no interval (rescaled devices, split runs): the point estimates within 5% are not told apart,
    the missing interval is a warning, and the notes stay apart from the warnings."""
    from rich.console import Console

    from rlsim.cli.study import print_verdict
    from rlsim.present.tables import NO_INTERVAL

    rows = [{"rank": 1, "prompts": 64, "responses_per_update": 512, "time_to_target_ratio": 0.80,
             "regime": "time falls", "warnings": "study warning; with a; inside",
             "notes": "generation x2.1 (bandwidth)"},
            {"rank": 2, "prompts": 96, "responses_per_update": 768, "time_to_target_ratio": 0.83,
             "regime": "time falls", "warnings": "study warning; with a; inside; extrapolated 8x"},
            {"rank": 3, "prompts": 256, "responses_per_update": 2048, "time_to_target_ratio": 1.5,
             "regime": "time rises"}]
    meta = {"warnings": ["study warning; with a; inside"], "notes": ["rho model: noise-scale"]}
    con = Console(width=400, record=True, highlight=False)
    print_verdict(con, rows, meta, ["prompts"], {"prompts": "--batch"})
    lines = con.export_text().splitlines()
    assert lines[0].startswith("Undecided between --batch 64 and --batch 96: T / T_ref 0.800, 0.830: they lie "
                               "within 5%")
    assert lines[1:4] == ["warning: study warning; with a; inside", "warning: " + NO_INTERVAL,
                          "warning (--batch 96): extrapolated 8x"]  # a config's own warning, under its name
    assert lines[4:] == ["note: rho model: noise-scale", "note: generation x2.1 (bandwidth)"]


def test_sweep_labels_the_reference_and_names_each_config_once(calibrated_path, tmp_path):
    """The reference's own config is `reference` in the table, results.csv and sweep.json (as `rlsim rank` says);
    the legend explains the marks; a config's warnings come under its name once, a shared warning once for all."""
    res = _invoke(["sweep", "--trace", calibrated_path, "--batch", "4,8,16,64", "--updates", "5", "--out",
                   tmp_path / "o", "--workers", "1", "--no-charts"])
    assert res.exit_code == 0, res.output
    rows, meta = results.read_results(tmp_path / "o")
    assert {r["prompts"]: r["regime"] for r in rows}[16] == "reference" == meta["reference"]["regime"]
    assert sum(r["regime"] == "reference" for r in rows) == 1
    assert ',"reference",' in (tmp_path / "o" / "results.csv").read_text()
    out = " ".join(res.output.split())
    table = res.output[res.output.index("Ranking"):res.output.index("reference: the trace's own config")]
    assert any(line.split()[1:2] == ["16"] and line.split()[-2] == "reference" for line in table.splitlines()
               if line.lstrip()[:1].isdigit())
    assert "reference: the trace's own config" in out
    if any(line.lstrip().split()[0].endswith("!") for line in table.splitlines() if line.lstrip()[:1].isdigit()):
        assert "! after the rank: the config has warnings of its own" in out
    warned = [line for line in res.output.split("\nwarning")[1:] if line.startswith(" (")]
    named = [line[2:line.index("):")] for line in warned]
    assert len(named) == len(set(named))  # each set of configs once
    for w in meta.get("warnings", []):
        assert out.count(" ".join(w.split())) == 1


def test_a_sweep_folder_with_the_older_column_name_reads(tmp_path):
    """results.parquet written when B's column was `batch` reads with it as responses_per_update (report, plan)."""
    import pyarrow as pa

    pq.write_table(pa.table({"rank": [2, 1], "prompts": [64, 32], "batch": [512, 256]}), tmp_path / "results.parquet")
    rows, _ = results.read_results(tmp_path)
    assert rows == [{"rank": 1, "prompts": 32, "responses_per_update": 256},
                    {"rank": 2, "prompts": 64, "responses_per_update": 512}]


def test_sweep_verdict_keeps_a_command_on_one_line(tmp_path):
    # piped output is 80 columns to rich: the probe command the undecided warning names must not be broken
    trace = Path(__file__).resolve().parents[2] / "traces" / "grpo_p128.parquet"
    r = _invoke(["sweep", "--trace", trace, "--batch", "128,256", "--updates", "10", "--no-charts", "--out",
                 tmp_path / "s"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if "rlrun probe" in x)
    assert "rlrun probe --algo grpo --prompts 128,256 --group 8 --task add2)" in line, r.output
