"""Charts: each spec draws the data it was given with the marks it should (checked in the Vega-Lite spec), PNGs
are valid images, HTML opens offline (JS inlined); regime and boundary helpers."""
import re
from pathlib import Path

import pytest

from tests.sim.study_synth import make_trace

from rlsim.replay.io import read_trace  # noqa: E402
from rlsim.present import charts as ch  # noqa: E402
from rlsim.replay.timeline import recorded_timeline


def _rows():
    rows = []
    for g in (4, 8):
        for p in (8, 16, 32, 64, 128):
            b = p * g
            sigma = (min(b, 512) / 32) ** 0.5
            rho = 1.0 if b <= 256 else b / 256
            r = rho / sigma
            rows.append({"prompts": p, "group": g, "lr_rule": "sqrt", "sigma": sigma, "rho": rho,
                         "responses_per_s": 50 * sigma, "time_to_target_ratio": r,
                         "regime": "time falls" if r < 0.95 else ("time rises" if r > 1.05 else "flat")})
    return rows


def _check_png(path, min_w=300, min_h=150, min_bytes=5000):
    w, h = ch.png_size(path)
    assert w >= min_w and h >= min_h, (w, h)
    assert Path(path).stat().st_size >= min_bytes


def _content(chart) -> tuple[set, list]:
    """(mark types, data rows) of a chart's Vega-Lite spec, over all layers and concatenations."""
    spec = chart.to_dict()
    marks, rows = set(), []

    def walk(o):
        if isinstance(o, dict):
            m = o.get("mark")
            if m:
                marks.add(m if isinstance(m, str) else m["type"])
            if isinstance(o.get("data"), dict) and "values" in o["data"]:
                rows.extend(o["data"]["values"])
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(spec)
    for vals in spec.get("datasets", {}).values():
        rows.extend(vals)
    return marks, rows


def _check_html(path):
    text = Path(path).read_text()
    assert "vegaEmbed" in text and "window.vegaEmbed=" in text  # the bundle itself is inlined
    assert not re.search(r"<script[^>]+src=", text)  # no network fetch for scripts


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return read_trace(make_trace(tmp_path_factory.mktemp("tr") / "syn.parquet", updates=4))


def test_sweep_charts_draw_every_config():
    rows = _rows()
    marks, data = _content(ch.time_to_target_chart(rows, series=["group"], prefer={"group": 4}, reference_batch=32))
    assert {"line", "rect"} <= marks  # the curves over regime bands
    drawn = {(d.get("batch"), round(d["time_to_target_ratio"], 9)) for d in data if "time_to_target_ratio" in d}
    assert {(r["prompts"] * r["group"], round(r["time_to_target_ratio"], 9)) for r in rows} <= drawn
    bands = [d for d in data if "regime" in d and "x0" in d]
    # bands follow the preferred series (G=4): T ratio 1.0 at B=32 (flat), below 0.95 from B=64 on (falls); past its
    # last point, G=8's own at B=1024 (T ratio 1.0, flat)
    assert [b["regime"] for b in sorted(bands, key=lambda b: b["x0"])] == ["flat", "falls", "flat"]
    marks, data = _content(ch.sigma_rho_chart(rows, series=["group"]))
    assert "line" in marks
    for key in ("sigma", "rho"):
        assert {round(r[key], 9) for r in rows} <= {round(d[v], 9) for d in data for v in d if v in (key, "value")
                                                     and isinstance(d[v], float)}


def test_sweep_charts_save_valid_png_and_offline_html(tmp_path):
    rows = _rows()
    for name, chart in [("ttt", ch.time_to_target_chart(rows, series=["group"], prefer={"group": 4},
                                                        reference_batch=32)),
                        ("sigma_rho", ch.sigma_rho_chart(rows, series=["group"]))]:
        paths = ch.save_chart(chart, tmp_path, name)
        _check_png(paths["png"])
        _check_html(paths["html"])


def test_trace_charts_save_valid_png(tmp_path, trace):
    pts = ch.measured_throughput_points(trace)
    assert len(pts) == int((trace.rows("gen_step")["decode_tokens"] > 0).sum())  # steps that sampled tokens
    curve = [{"num_running": n, "tokens_per_s": n / (4e-3 + 1.5e-4 * n)} for n in (1, 2, 4, 8, 16, 32)]
    spans, counters = recorded_timeline(trace)
    marks, data = _content(ch.throughput_chart(pts, curve))
    assert {"circle", "line"} <= marks  # measured steps, fitted curve
    assert sorted(d["num_running"] for d in data if "step" in d) == sorted(p["num_running"] for p in pts)
    marks, data = _content(ch.gantt_chart(spans, counters, title="recorded"))
    assert "bar" in marks
    assert {"gen/engine0", "train/trainer0", "sync"} <= {d["lane"] for d in data if "lane" in d}
    first_update = min((s for s in spans if s.track == "update"), key=lambda s: s.start)
    assert any(d.get("kind") == "update" and d["start"] == first_update.start for d in data)
    for name, chart in [("tp", ch.throughput_chart(pts, curve)),
                        ("lc", ch.learning_chart(ch.trace_learning_curves([trace]), target=0.6)),
                        ("gantt", ch.gantt_chart(spans, counters, title="recorded"))]:
        paths = ch.save_chart(chart, tmp_path, name)
        _check_png(paths["png"])


def test_regime_bands_merge_and_split_at_geometric_midpoints():
    bands = ch.regime_bands([(64, "time falls"), (128, "falls"), (256, "flat"), (512, "time rises")])
    assert [b["regime"] for b in bands] == ["falls", "flat", "rises"]
    assert bands[0]["x1"] == pytest.approx((128 * 256) ** 0.5)
    assert bands[1]["x1"] == pytest.approx((256 * 512) ** 0.5)
    assert bands[0]["x0"] < 64 and bands[-1]["x1"] > 512


def _x_domain(chart) -> list:
    """The x scale's domain as the spec sets it (the layers share one x scale)."""
    found = []

    def walk(o):
        if isinstance(o, dict):
            x = (o.get("encoding") or {}).get("x") or {}
            if isinstance(x, dict) and "domain" in (x.get("scale") or {}):
                found.append(x["scale"]["domain"])
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(chart.to_dict())
    assert found and all(d == found[0] for d in found)
    return found[0]


@pytest.mark.parametrize("prefer", [{"group": 8}, {"group": 4}])
def test_regime_shading_covers_every_point_and_the_axis(prefer):
    """Two series whose batches interleave (the primary misses both end points), the reference's own row and a row
    whose regime names none: every plotted batch lies inside a band, and the axis spans the bands and no more."""
    rows = [{"prompts": p, "group": g, "time_to_target_ratio": t, "regime": reg}
            for p, g, t, reg in [(32, 4, 1.27, "time rises"), (32, 8, 1.06, "undecided"), (128, 4, 1.0, "reference"),
                                 (128, 8, 1.36, "time rises"), (512, 4, 1.9, "time rises"), (512, 8, 0.7, "")]]
    chart = ch.time_to_target_chart(rows, series=["group"], prefer=prefer, critical={}, reference_batch=512)
    _, data = _content(chart)
    bands = sorted((d for d in data if "x0" in d), key=lambda b: b["x0"])
    assert all(a["x1"] == pytest.approx(b["x0"]) for a, b in zip(bands, bands[1:]))  # no gap between bands
    plotted = sorted({d["batch"] for d in data if "time_to_target_ratio" in d})
    assert plotted == [128, 256, 512, 1024, 2048, 4096]
    for b in plotted:
        inside = [band for band in bands if band["x0"] < b < band["x1"]]
        assert len(inside) == 1, (b, bands)
    shade = {b: next(band["regime"] for band in bands if band["x0"] < b < band["x1"]) for b in plotted}
    assert shade[512] == "flat" and shade[4096] == "falls"  # the reference is flat; a bare label: its T ratio's
    assert shade[128] == "rises" and shade[2048] == "rises"
    assert _x_domain(chart) == [pytest.approx(bands[0]["x0"]), pytest.approx(bands[-1]["x1"])]


def test_critical_batches_from_a_series():
    rows = [r for r in _rows() if r["group"] == 4]
    crit = ch.critical_batches(rows)
    # throughput saturates at B = 512 (>= 90% of the best there); rho stays <= 1.1 up to B = 256
    assert crit == {"critical_gen_batch": 512.0, "critical_train_batch": 256.0}


def test_gantt_merges_consecutive_engine_steps(trace):
    spans, _ = recorded_timeline(trace)
    bars = ch.merge_spans(spans, gap=1e-3)  # the synthetic engine leaves 0.2 ms between steps
    gen = [b for b in bars if b["kind"] == "gen_step"]
    assert len(gen) == trace.count("update")  # one generation phase per RL step
    assert sum(b["slices"] for b in gen) == trace.count("gen_step")
    assert not [b for b in bars if b["kind"] == "response"]


def test_png_size_rejects_non_png(tmp_path):
    p = tmp_path / "x.png"
    p.write_bytes(b"GIF89a" + b"\0" * 30)
    with pytest.raises(ValueError):
        ch.png_size(p)


def _walk(o, out):
    """Every dict of a spec, depth first."""
    if isinstance(o, dict):
        out.append(o)
        for v in o.values():
            _walk(v, out)
    elif isinstance(o, list):
        for v in o:
            _walk(v, out)
    return out


def _with_intervals(rows):
    out = []
    for r in rows:
        t = r["time_to_target_ratio"]
        out.append(dict(r, time_to_target_ratio_lo=t * 0.9, time_to_target_ratio_hi=t * 1.1, sigma_lo=r["sigma"] * 0.95,
                        sigma_hi=r["sigma"] * 1.05, rho_lo=r["rho"] * 0.9, rho_hi=r["rho"] * 1.1))
    return out


def test_time_to_target_and_sigma_rho_charts_draw_intervals_and_undecided():
    rows = _with_intervals([r for r in _rows() if r["group"] == 4])
    rows[1] = dict(rows[1], time_to_target_ratio_lo=0.8, time_to_target_ratio_hi=1.2, regime="undecided")  # B=64
    rows[0] = dict(rows[0], time_to_target_ratio_lo=float("nan"), time_to_target_ratio_hi=None)  # B=32: no interval
    marks, data = _content(ch.time_to_target_chart(rows, reference_batch=32))
    assert "errorbar" in marks
    bars = {(d["batch"], d["lo"], d["hi"]) for d in data if d.get("lo") is not None and "time_to_target_ratio" in d}
    assert (64.0, 0.8, 1.2) in bars and not any(b == 32.0 for b, _, _ in bars)
    assert len(bars) == len(rows) - 1
    assert [d["batch"] for d in data if d.get("regime") == "undecided" and "time_to_target_ratio" in d] == [64.0]
    assert _rings(ch.time_to_target_chart(rows, reference_batch=32))  # ringed, with its legend entry
    assert "undecided" in {d["regime"] for d in data if "x0" in d}  # the band of the undecided config
    marks, data = _content(ch.sigma_rho_chart(rows))
    assert "errorbar" in marks
    sig = {(d["batch"], round(d["lo"], 9), round(d["hi"], 9))
           for d in data if d.get("metric") == "sigma" and d.get("lo")}
    assert {(float(r["prompts"] * 4), round(r["sigma_lo"], 9), round(r["sigma_hi"], 9)) for r in rows} == sig
    assert _rings(ch.sigma_rho_chart(rows))
    plain = [dict(r, regime="time falls") for r in rows]
    assert not _rings(ch.time_to_target_chart(plain)) and not _rings(ch.sigma_rho_chart(plain))


def _rings(chart) -> list:
    """The layers ringing undecided points: open points, filtered to the undecided regime, in the legend."""
    return [d for d in _walk(chart.to_dict(), [])
            if isinstance(d.get("mark"), dict) and d["mark"].get("type") == "point"
            and d["mark"].get("filled") is False and "undecided" in str(d.get("transform"))
            and ch.UNDECIDED_LABEL in str(d.get("transform"))]


def test_one_series_draws_no_legend_for_it():
    """A one-entry legend ("series: all") says nothing: with one series there is no strokeDash, with two there is."""
    one = [r for r in _rows() if r["group"] == 4]
    for chart in (ch.time_to_target_chart(one, reference_batch=32), ch.sigma_rho_chart(one)):
        spec = chart.to_dict()
        assert not [d for d in _walk(spec, []) if "strokeDash" in d and isinstance(d["strokeDash"], dict)
                    and d["strokeDash"].get("field") == "series"]
        assert '"title": "series"' not in chart.to_json()
    for chart in (ch.time_to_target_chart(_rows(), series=["group"], prefer={"group": 4}),
                  ch.sigma_rho_chart(_rows(), series=["group"])):
        assert [d for d in _walk(chart.to_dict(), [])
                if isinstance(d.get("strokeDash"), dict) and d["strokeDash"].get("field") == "series"]
    lc = ch.learning_chart({"only (P=8, G=4)": [(1.0, 0.1), (2.0, 0.3)]})
    assert not [d for d in _walk(lc.to_dict(), [])
                if isinstance(d.get("color"), dict) and d["color"].get("field") == "trace"]
    assert "only (P=8, G=4)" in lc.to_json()  # named in the title instead
    lc2 = ch.learning_chart({"a": [(1.0, 0.1)], "b": [(1.0, 0.2)]})
    assert [d for d in _walk(lc2.to_dict(), [])
            if isinstance(d.get("color"), dict) and d["color"].get("field") == "trace"]


def test_critical_batch_labels_do_not_overlap_and_the_generation_rule_has_its_own_colour():
    """The critical generation batch, the critical training batch and the reference at (nearly) one batch: each label
    on its own line, each rule in a colour of its own, none the data line's."""
    rows = [r for r in _rows() if r["group"] == 4]
    chart = ch.time_to_target_chart(rows, critical={"critical_gen_batch": 256.0, "critical_train_batch": 240.0},
                                    reference_batch=256)
    layers = [d for d in _walk(chart.to_dict(), []) if "mark" in d]
    texts = [lay for lay in layers if (lay["mark"] if isinstance(lay["mark"], str) else lay["mark"]["type"]) == "text"]
    assert len(texts) == 3
    ys = [lay["encoding"]["y"]["value"] for lay in texts]
    assert len(set(ys)) == 3 and min(abs(a - b) for i, a in enumerate(ys) for b in ys[i + 1:]) >= 10  # one line each
    rules = [lay for lay in layers
             if isinstance(lay["mark"], dict) and lay["mark"]["type"] == "rule" and "x" in lay["encoding"]]
    colours = [lay["mark"]["color"] for lay in rules]
    assert len(set(colours)) == 3 and ch.LINE_COLOR not in colours
    line = next(lay for lay in layers if isinstance(lay["mark"], dict) and lay["mark"]["type"] == "line")
    assert line["mark"]["color"] == ch.LINE_COLOR
    _, data = _content(chart)
    assert {d["label"] for d in data if "label" in d} == {"critical generation batch B\u2248256",
                                                          "critical training batch B\u2248240",
                                                          "reference (trace) B=256"}


def test_mark_labels_stack_and_turn_at_the_right_edge():
    marks = [{"batch": 1024.0, "label": "b"}, {"batch": 1024.0, "label": "a"}, {"batch": 64.0, "label": "c"}]
    out = ch.mark_labels(marks, (32.0, 2048.0))
    assert [m["label"] for m in out] == ["c", "a", "b"]
    assert [m["y"] for m in out] == [6.0, 19.0, 32.0]
    assert [m["align"] for m in out] == ["left", "right", "right"] and out[1]["dx"] < 0 < out[0]["dx"]
