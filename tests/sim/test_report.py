"""`rlsim report`: one self-contained page with the trace summary, fitted models, every chart and the ranking;
`rlsim sweep` writes every chart as HTML and PNG."""
import json
import re

import pytest
from typer.testing import CliRunner

from tests.sim.study_synth import make_trace

from rlsim.present.charts import png_size  # noqa: E402
from rlsim.cli import app  # noqa: E402
from rlsim.present.views import CHARTS

runner = CliRunner()


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    d = tmp_path_factory.mktemp("rep")
    trace = make_trace(d / "grpo.parquet", prompts=8, group=4, updates=6, max_num_seqs=32)
    out = d / "sweep"
    res = runner.invoke(app, ["sweep", "--trace", str(trace), "--batch", "4,8,16,32,64", "--group", "4,8",
                              "--updates", "6", "--out", str(out), "--workers", "1"])
    assert res.exit_code == 0, res.output
    return trace, out


def test_sweep_writes_every_chart_as_html_and_png(swept):
    _, out = swept
    for name, _ in CHARTS:
        w, h = png_size(out / "charts" / f"{name}.png")
        assert w >= 400 and h >= 200 and (out / "charts" / f"{name}.png").stat().st_size > 10_000, name
        html = (out / "charts" / f"{name}.html").read_text()
        assert "window.vegaEmbed=" in html and not re.search(r"<script[^>]+src=", html), name


def test_report_is_self_contained_with_every_chart_and_the_ranking(swept, tmp_path):
    import vl_convert as vlc

    trace, out = swept
    page = tmp_path / "report.html"
    res = runner.invoke(app, ["report", "--trace", str(trace), "--sweep", str(out), "-o", str(page)])
    assert res.exit_code == 0, res.output
    html = page.read_text()
    assert not re.search(r"<script[^>]+src=", html) and "window.vegaEmbed=" in html
    assert html.count("window.vegaEmbed=") == 1  # the bundle is inlined once for all charts
    for name, title in CHARTS:
        assert f"id='chart-{name}'" in html and title in html, name
        spec = json.loads(re.search(rf"<script type='application/json' id='spec-{name}'>(.*?)</script>", html,
                                    re.S).group(1))
        svg = vlc.vegalite_to_svg(spec)  # the embedded spec renders
        assert svg.startswith("<svg") and len(svg) > 2000, name
    for section in ("id='summary'", "id='traces'", "id='models'", "id='ranking'", "id='charts'", "Fit quality",
                    "gen_step", "R²"):
        assert section in html, section
    assert html.count("<tr>") >= 10 + 1  # the 10 configs of the ranking, and more
    res = runner.invoke(app, ["report", "--trace", str(trace), "--sweep", str(out), "-o", str(page)])
    assert res.exit_code == 2 and "already exists" in res.output


def test_report_rejects_a_sweep_of_another_trace(swept, tmp_path):
    _, out = swept
    other = make_trace(tmp_path / "other.parquet", prompts=4, group=4, updates=4, seed=5)
    res = runner.invoke(app, ["report", "--trace", str(other), "--sweep", str(out), "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 2 and "other traces" in res.output


def test_report_without_sweep_results_is_one_line(swept, tmp_path):
    trace, _ = swept
    res = runner.invoke(app, ["report", "--trace", str(trace), "--sweep", str(tmp_path), "-o",
                              str(tmp_path / "r.html")])
    assert res.exit_code == 2 and "no results.parquet" in res.output and len(res.output.strip().splitlines()) == 1


def test_report_without_a_sweep_has_the_trace_charts(swept, tmp_path):
    trace, _ = swept
    page = tmp_path / "r.html"
    res = runner.invoke(app, ["report", "--trace", str(trace), "-o", str(page)])
    assert res.exit_code == 0, res.output
    html = page.read_text()
    for name in ("gen_throughput", "learning_curves", "timeline"):
        assert f"id='chart-{name}'" in html
    assert "id='chart-time_to_target'" not in html and "id='ranking'" not in html


def _row(p, t, lo, hi, regime, **kw):
    return {"rank": 0, "prompts": p, "group": 4, "lr_rule": "sqrt", "responses_per_update": 4 * p,
            "responses_per_s": 100.0 * t,
            "responses_per_s_lo": 95.0 * t, "responses_per_s_hi": 105.0 * t, "step_time_s": 1.0, "sigma": 1 / t,
            "sigma_lo": 0.95 / t, "sigma_hi": 1.05 / t, "rho": 1.0, "rho_lo": 1.0, "rho_hi": 1.0,
            "rho_model": "noise-scale", "time_to_target_ratio": t, "time_to_target_ratio_lo": lo,
            "time_to_target_ratio_hi": hi, "regime": regime, "interval": "90% bootstrap (test)", "warnings": "",
            "notes": "", **kw}


def _meta(**kw):
    return {"grid": {"axes": {"prompts": [4, 8, 16]}, "options": {"prompts": "--batch"}},
            "reference": {"prompts": 8, "group": 4, "responses_per_s": 100.0}, **kw}


def _ranked(rows):
    return [dict(r, rank=i + 1) for i, r in enumerate(rows)]


def test_verdict_is_undecided_when_the_best_interval_spans_one():
    from rlsim.present.tables import sweep_verdict

    rows = _ranked([_row(4, 0.9, 0.8, 1.1, "undecided"), _row(8, 1.0, 1.0, 1.0, "flat"),
                    _row(16, 1.4, 1.3, 1.5, "time rises")])
    v = sweep_verdict(rows, _meta())
    assert (v["kind"] == "undecided" and "may not beat the reference" in v["title"]
            and "0.900 (0.800..1.100)" in v["text"])
    # the regime field alone is not trusted: an interval spanning 1 is undecided whatever the label says
    rows[0]["regime"] = "time falls"
    assert sweep_verdict(rows, _meta())["kind"] == "undecided"


def test_verdict_is_tied_when_the_runner_up_interval_overlaps():
    from rlsim.present.tables import sweep_verdict

    rows = _ranked([_row(4, 0.80, 0.70, 0.90, "time falls"), _row(8, 0.85, 0.78, 0.93, "time falls"),
                    _row(16, 1.4, 1.3, 1.5, "time rises")])
    v = sweep_verdict(rows, _meta(), describe_row=lambda r: f"--batch {r['prompts']}")
    assert v["kind"] == "tied" and v["title"] == "Undecided between --batch 4 and --batch 8"
    assert [r["prompts"] for r in v["tied"]] == [8] and "both reach the target sooner" in v["text"]
    rows[1].update(time_to_target_ratio=0.95, time_to_target_ratio_lo=0.91, time_to_target_ratio_hi=0.99)
    v = sweep_verdict(rows, _meta(), describe_row=lambda r: f"--batch {r['prompts']}")
    assert v["kind"] == "clear" and v["title"] == "Best of 3 configs: --batch 4" and "do not overlap" in v["text"]
    # the best config does not beat the reference: no "Best"
    worse = _ranked([_row(8, 1.2, 1.1, 1.3, "time rises"), _row(16, 1.6, 1.5, 1.7, "time rises")])
    v = sweep_verdict(worse, _meta(), describe_row=lambda r: f"--batch {r['prompts']}")
    assert v["kind"] == "clear" and v["title"] == "No config beats the reference; the closest is --batch 8"
    # without intervals, T ratios within 5% are not told apart, and the missing interval is a caveat
    bare = [{k: v for k, v in r.items() if not k.endswith(("_lo", "_hi"))} for r in rows]
    bare[1]["time_to_target_ratio"] = 0.82
    v = sweep_verdict(bare, _meta())
    assert v["kind"] == "tied" and any("no interval" in w for w in v["warnings"])


def test_verdict_keeps_warnings_apart_from_notes():
    from rlsim.present.tables import sweep_verdict

    rows = _ranked([_row(4, 0.6, 0.5, 0.7, "time falls", warnings="extrapolated 8x; KV cache full",
                         notes="generation rescaled x2.0 (bandwidth)"), _row(8, 1.0, 1.0, 1.0, "flat")])
    v = sweep_verdict(rows, _meta(warnings=["rho is a guess"], notes=["rho model: noise-scale"]))
    assert v["warnings"] == ["rho is a guess"]
    assert v["config_warnings"] == [{"configs": ["prompts 4 group 4 lr_rule sqrt"], "warnings": ["extrapolated 8x",
                                                                                                 "KV cache full"]}]
    assert v["notes"] == ["rho model: noise-scale", "generation rescaled x2.0 (bandwidth)",
                          "intervals: 90% bootstrap (test)"]


def test_verdict_names_each_config_once_and_a_shared_warning_once():
    from rlsim.present.tables import config_warning_items, sweep_verdict

    spans = "the T / T_ref interval spans 1: undecided"
    rows = _ranked([_row(4, 0.90, 0.80, 1.10, "undecided", warnings=f"rho is a guess; {spans}; probe 4,8"),
                    _row(16, 0.95, 0.85, 1.08, "undecided",
                         warnings=f"rho is a guess; {spans}; probe 8,16; KV cache full"),
                    _row(8, 1.0, 1.0, 1.0, "reference", warnings="rho is a guess")])
    v = sweep_verdict(rows, _meta(warnings=["rho is a guess"]), describe_row=lambda r: f"--batch {r['prompts']}")
    assert v["kind"] == "undecided" and [r["prompts"] for r in v["tied"]] == [16, 8]
    assert v["warnings"] == ["rho is a guess"]  # the study's, once, not once per config
    assert config_warning_items(v) == [("--batch 4 and --batch 16", spans), ("--batch 4", "probe 4,8"),
                                       ("--batch 16", "probe 8,16; KV cache full")]


def test_the_reference_as_the_best_is_named_so():
    from rlsim.present.tables import sweep_verdict

    rows = _ranked([_row(8, 1.0, 1.0, 1.0, "reference"), _row(16, 1.4, 1.3, 1.5, "time rises")])
    v = sweep_verdict(rows, _meta(), describe_row=lambda r: f"--batch {r['prompts']}")
    assert v["title"] == "No config beats the reference; the best is the reference itself, --batch 8"
    assert not any("no interval" in w for w in v["warnings"])


def _summary(html_text):
    return html_text[html_text.index("id='summary'"):html_text.index("id='ranking'")]


def test_report_headline_says_undecided_and_shows_intervals_and_caveats(swept, tmp_path):
    """A sweep whose best config's T interval spans 1: the headline does not call a winner, the table carries
    the intervals, the study's warnings are in the caveats box and its notes folded away."""
    from rlsim.present.results import write_results

    trace, _ = swept
    rows = _ranked([_row(4, 0.9, 0.8, 1.1, "undecided", warnings="T / T_ref interval 0.8..1.1 spans 1"),
                    _row(8, 1.0, 1.0, 1.0, "flat"),
                    _row(16, 1.4, 1.3, 1.5, "time rises", notes="step cost extrapolated 2x")])
    write_results(tmp_path / "sw", rows,
                  _meta(warnings=["rho from one trace is a guess"], notes=["rho model: noise-scale"]))
    page = tmp_path / "r.html"
    res = runner.invoke(app, ["report", "--trace", str(trace), "--sweep", str(tmp_path / "sw"), "-o", str(page)])
    assert res.exit_code == 0, res.output
    html = page.read_text()
    head = _summary(html)
    assert "Undecided: --batch 4 may not beat the reference" in head and "Best of" not in head
    assert "0.900 (0.800..1.100)" in head and "time falls" not in head
    box = head[head.index("class='warnbox'"):]
    assert "rho from one trace is a guess" in box.split("</div>")[0]
    assert "T / T_ref interval 0.8..1.1 spans 1" in box.split("</div>")[0]
    notes = head[head.index("<details"):]
    assert "rho model: noise-scale" in notes and "rho model: noise-scale" not in box.split("</div>")[0]
    table = html[html.index("id='ranking'"):html.index("id='traces'")]
    assert "<span class='iv'>0.800..1.100</span>" in table and "<span class='iv'>1.300..1.500</span>" in table
    assert "<span class='undecided'>undecided</span>" in table
    assert "step cost extrapolated 2x" in table[table.index("<details"):]  # a config's note, folded
    spec = json.loads(re.search(r"<script type='application/json' id='spec-time_to_target'>(.*?)</script>", html,
                                re.S).group(1))
    assert '"errorbar"' in json.dumps(spec) and '"hi": 1.1' in json.dumps(spec)


def test_report_headline_names_the_best_only_when_it_is_clear(swept, tmp_path):
    from rlsim.present.results import write_results

    trace, _ = swept
    for name, rows, want in [
            ("tied", [_row(4, 0.80, 0.70, 0.90, "time falls"), _row(8, 0.85, 0.78, 0.93, "time falls")],
             "Undecided between --batch 4 and --batch 8"),
            ("clear", [_row(4, 0.60, 0.50, 0.70, "time falls"), _row(8, 0.85, 0.78, 0.93, "time falls")],
             "Best of 2 configs: --batch 4")]:
        write_results(tmp_path / name, _ranked(rows), _meta())
        page = tmp_path / f"{name}.html"
        res = runner.invoke(app, ["report", "--trace", str(trace), "--sweep", str(tmp_path / name), "-o", str(page)])
        assert res.exit_code == 0, res.output
        head = _summary(page.read_text())
        assert want in head, name
        assert ("Best of" in head) == (name == "clear")
