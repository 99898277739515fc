"""`rlsim report`: one self-contained page with the trace summary, fitted models, every chart and the ranking;
`rlsim sweep` writes every chart as HTML and PNG."""
import json
import re

import pytest
from typer.testing import CliRunner

from tests.sim.study_synth import make_trace

from rlsim.charts import png_size  # noqa: E402
from rlsim.cli import app  # noqa: E402
from rlsim.views import CHARTS

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
        spec = json.loads(re.search(rf"<script type='application/json' id='spec-{name}'>(.*?)</script>", html, re.S).group(1))
        svg = vlc.vegalite_to_svg(spec)  # the embedded spec renders
        assert svg.startswith("<svg") and len(svg) > 2000, name
    for section in ("id='summary'", "id='traces'", "id='models'", "id='ranking'", "id='charts'", "Fit quality", "gen_step", "R²"):
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
    res = runner.invoke(app, ["report", "--trace", str(trace), "--sweep", str(tmp_path), "-o", str(tmp_path / "r.html")])
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
