"""Altair charts of a study, saved as self-contained HTML (Vega JS inlined) and PNG (vl-convert).

Every chart function takes plain rows (dicts) so the same charts serve `rlsim sweep` (results rows),
`rlsim report` and tests:

- `time_to_target_chart`: T_new / T_ref vs batch with the regimes shaded (undecided too), the intervals as
  error bars, undecided configs ringed, and the critical generation and training batches and the reference
  marked, each label on its own line;
- `sigma_rho_chart`: sigma and rho vs batch, with their intervals;
- `throughput_chart`: generation throughput vs concurrency, measured engine steps with the fitted
  step-cost model drawn over them;
- `learning_chart`: eval score vs cumulative training responses, one line per trace;
- `split_chart`: T_new / T_ref over the generation : training device split, one line per staleness limit;
- `gantt_chart`: the timeline of one simulated (or recorded) run: generation / training / sync lanes
  per device, with the running-sequences counter under it.

A legend is drawn only where it tells lines apart: series (swept options other than the x axis), traces and
staleness limits get none when there is only one (the chart's title names it where it matters).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import altair as alt
import numpy as np

from rlsim.replay.rho import regime, regime_key
from rlsim.replay.timeline import lane_key
from rlsim.replay.util import json_safe

REGIME_COLORS = {"falls": "#c7e9c0", "flat": "#fdf5c4", "rises": "#fcc5c0", "undecided": "#dcdcdc"}
LINE_COLOR = "#4c78a8"  # the data line (altair's first colour)
# the boundaries drawn as rules on the time-to-target chart: label, colour (none the data line's), dash
MARK_STYLES = {"critical_gen_batch": ("critical generation batch", "#7b3294", []),
               "critical_train_batch": ("critical training batch", "#b7312c", []),
               "reference": ("reference (trace)", "#555555", [5, 3])}
UNDECIDED_COLOR = "#c27c0e"
UNDECIDED_LABEL = "undecided: T interval spans 1"
WIDTH, HEIGHT = 560, 300
MAX_POINTS = 4000


def _data(rows: Sequence[Mapping[str, Any]]) -> alt.Data:
    return alt.Data(values=[{k: json_safe(v) for k, v in r.items()} for r in rows])


def _finite(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def batch_of(row: Mapping[str, Any]) -> float:
    """Responses per update B = P x G."""
    if _finite(row.get("responses_per_update")):
        return float(row["responses_per_update"])
    return float(row["prompts"]) * float(row.get("group") or 1)


def series_label(row: Mapping[str, Any], keys: Sequence[str]) -> str:
    return ", ".join(f"{k}={row.get(k)}" for k in keys) or "all"


def interval_of(row: Mapping[str, Any], key: str) -> tuple[float, float] | None:
    """(lo, hi) of `key` from the row's `<key>_lo` / `<key>_hi` where both are finite and hi > lo."""
    lo, hi = row.get(key + "_lo"), row.get(key + "_hi")
    if _finite(lo) and _finite(hi) and float(hi) > float(lo):
        return float(lo), float(hi)
    return None


def _series_dash(series: Sequence[str]) -> dict:
    """The strokeDash encoding of the series, only when there is more than one (a one-entry legend says nothing)."""
    legend = alt.Legend(symbolType="stroke", symbolStrokeWidth=2, symbolStrokeColor="#555")
    return {"strokeDash": alt.StrokeDash("series:N", title=", ".join(series), legend=legend)} if series else {}


def _series(points: Sequence[Mapping[str, Any]], series: Sequence[str], *, x: alt.X, y: alt.Y, ytitle: str,
            yscale: alt.Scale, tooltip: list, color: Any = None, line_color: str | None = None,
            ring_when: str = "") -> alt.LayerChart:
    """The points (their data once, in one layer): error bars from `lo` / `hi` where both are there, a line per
    series (dashed by series when there are several), the points drawn apart from the line (drawn by the line mark,
    they would turn the series legend's dashes into dots), and open rings around the undecided ones, with the
    one legend entry that explains the ring. `ring_when`: a further Vega condition on the ringed points."""
    enc = {"color": color} if color is not None else {}
    mark = {"color": line_color} if line_color else {}
    undecided = "datum.regime === 'undecided'" + (f" && ({ring_when})" if ring_when else "")
    layers = []
    if any(_finite(p.get("lo")) and _finite(p.get("hi")) for p in points):
        bar_color = color if color is not None else alt.value(line_color or LINE_COLOR)
        layers.append(alt.Chart().transform_filter("isValid(datum.lo) && isValid(datum.hi)").mark_errorbar(
            ticks=True, size=8, thickness=1.5).encode(
            x=x, y=alt.Y("lo:Q", title=ytitle, scale=yscale), y2="hi:Q", detail="series:N", color=bar_color))
    layers.append(alt.Chart().mark_line(**mark).encode(x=x, y=y, detail="series:N", **_series_dash(series), **enc))
    layers.append(alt.Chart().mark_point(filled=True, size=30, opacity=1,
                                         **mark).encode(x=x, y=y, tooltip=tooltip, **enc))
    if any(p.get("regime") == "undecided" for p in points):
        layers.append(alt.Chart().transform_filter(undecided).transform_calculate(verdict=f"'{UNDECIDED_LABEL}'").mark_point(
            filled=False, size=220, strokeWidth=2).encode(
            x=x, y=y, shape=alt.Shape("verdict:N", title=None, scale=alt.Scale(range=["circle"]),
                                      legend=alt.Legend(labelLimit=300)),
            color=alt.value(UNDECIDED_COLOR), tooltip=["verdict:N"]))
    return alt.layer(*layers, data=_data(points))


def mark_labels(marks: Sequence[Mapping[str, Any]], extent: tuple[float, float], *, top: float = 6.0,
                step: float = 13.0) -> list[dict]:
    """Placement of the boundary labels: each on its own line from the top (so no two overlap, even at the
    same batch), left of its rule in the right third of the log x extent and right of it elsewhere."""
    lo, hi = extent
    span = math.log(hi / lo) if lo > 0 and hi > lo else 0.0
    out = []
    for i, m in enumerate(sorted(marks, key=lambda m: (m["batch"], m["label"]))):
        frac = math.log(m["batch"] / lo) / span if span else 0.5
        right = frac > 0.65
        out.append(dict(m, y=top + step * i, align="right" if right else "left", dx=-4 if right else 4))
    return out


def varying_keys(rows: Sequence[Mapping[str, Any]], axes: Iterable[str],
                 exclude: Iterable[str] = ("prompts",)) -> list[str]:
    """Grid axes (other than the batch) that take more than one value: each combination is one series."""
    ex = set(exclude)
    out = []
    for k in axes:
        if k in ex:
            continue
        if len({repr(r.get(k)) for r in rows}) > 1:
            out.append(k)
    return out


def shade_key(label: Any, ratio: Any = None) -> str | None:
    """The band a point is shaded in: its regime's key (falls / flat / rises / undecided); the reference's own
    config is flat (T / T_ref = 1); a label that names no regime, the T ratio's regime."""
    if str(label) == "reference":
        return "flat"
    return regime_key(label) or (regime_key(regime(float(ratio))) if _finite(ratio) else None)


def regime_bands(points: Sequence[tuple[float, str]]) -> list[dict]:
    """Contiguous batch ranges with one regime, split at the geometric midpoint between neighbours and reaching a
    factor sqrt(2) past the end points. A batch given twice keeps its first regime."""
    first: dict[float, str] = {}
    for b, r in points:
        if b > 0 and shade_key(r) is not None:
            first.setdefault(float(b), shade_key(r))
    pts = sorted(first.items())
    if not pts:
        return []
    bands: list[dict] = []
    lo = pts[0][0] / math.sqrt(2)
    for i, (b, r) in enumerate(pts):
        hi = math.sqrt(b * pts[i + 1][0]) if i + 1 < len(pts) else b * math.sqrt(2)
        if bands and bands[-1]["regime"] == r:
            bands[-1]["x1"] = hi
        else:
            bands.append({"x0": lo if not bands else bands[-1]["x1"], "x1": hi, "regime": r})
        lo = hi
    return bands


def critical_batches(rows: Sequence[Mapping[str, Any]], *, plateau: float = 0.9,
                     invariance: float = 1.1) -> dict[str, float | None]:
    """The two boundaries read off one series of results:
    critical generation batch: smallest B whose throughput reaches `plateau` x the series' best
    (beyond it generation no longer speeds up); critical training batch: largest B whose rho stays
    within `invariance` (the end of approximate batch-size invariance)."""
    pts = sorted(((batch_of(r), r) for r in rows), key=lambda x: x[0])
    gen = train = None
    q = [(b, float(r["responses_per_s"])) for b, r in pts if _finite(r.get("responses_per_s"))]
    if q:
        best = max(v for _, v in q)
        gen = next((b for b, v in q if v >= plateau * best), None)
    rho = [(b, float(r["rho"])) for b, r in pts if _finite(r.get("rho"))]
    if rho:
        inside = [b for b, v in rho if v <= invariance]
        train = max(inside) if inside else None
    return {"critical_gen_batch": gen, "critical_train_batch": train}


def primary_series(rows: Sequence[Mapping[str, Any]], keys: Sequence[str],
                   prefer: Mapping[str, Any] | None) -> list[Mapping]:
    """The rows of one series: the one matching `prefer` (e.g. the trace's group and lr rule) or the first."""
    if not keys:
        return list(rows)
    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(series_label(r, keys), []).append(r)
    if prefer:
        for label, rs in groups.items():
            if all(str(rs[0].get(k)) == str(prefer[k]) for k in keys if k in prefer):
                return rs
    return next(iter(groups.values()))


def time_to_target_chart(rows: Sequence[Mapping[str, Any]], *, series: Sequence[str] = (),
                         critical: Mapping[str, float | None] | None = None,
                         prefer: Mapping[str, Any] | None = None,
                         reference_batch: float | None = None) -> alt.LayerChart:
    """T / T_ref vs batch, with the intervals as error bars, undecided points ringed, the regimes shaded under every
    point (the primary series' where it has a point) and the critical batches and the reference as rules, each
    labelled on its own line. The x axis spans the shading and the rules, no wider."""
    series = list(series)
    pts = []
    for r in rows:
        if not _finite(r.get("time_to_target_ratio")):
            continue
        iv = interval_of(r, "time_to_target_ratio")
        pts.append(dict(r, batch=batch_of(r), series=series_label(r, series), lo=iv[0] if iv else None,
                        hi=iv[1] if iv else None))
    primary = primary_series(pts, series, prefer)
    # every plotted batch is shaded: by the primary series' regime where it has a point, else by the point's own
    bands = regime_bands([(r["batch"], shade_key(r.get("regime"), r["time_to_target_ratio"])) for r in primary]
                         + [(r["batch"], shade_key(r.get("regime"), r["time_to_target_ratio"])) for r in pts])
    crit = dict(critical or critical_batches(primary))
    marks = []
    for key in ("critical_gen_batch", "critical_train_batch"):
        if _finite(v := crit.get(key)):
            marks.append({"key": key, "batch": float(v), "label": f"{MARK_STYLES[key][0]} B\u2248{float(v):.0f}"})
    if reference_batch:
        marks.append({"key": "reference", "batch": float(reference_batch),
                      "label": f"{MARK_STYLES['reference'][0]} B={float(reference_batch):.0f}"})
    xs = [p["batch"] for p in pts] + [m["batch"] for m in marks] + [b[k] for b in bands for k in ("x0", "x1")]
    xs = [v for v in xs if v > 0]
    extent = (min(xs), max(xs)) if xs else None
    xscale = alt.Scale(type="log", base=2, **({"domain": list(extent), "nice": False} if extent else {}))
    x = alt.X("batch:Q", scale=xscale, title="responses per update B = P x G")
    title = "T_new / T_ref = rho / sigma"
    yscale = alt.Scale(zero=False)
    y = alt.Y("time_to_target_ratio:Q", title=title, scale=yscale)
    layers = []
    if bands:
        present = [k for k in REGIME_COLORS if any(b["regime"] == k for b in bands)]
        layers.append(alt.Chart(_data(bands)).mark_rect(opacity=0.55).encode(
            x=alt.X("x0:Q", scale=xscale), x2="x1:Q",
            color=alt.Color("regime:N", scale=alt.Scale(domain=present, range=[REGIME_COLORS[k] for k in present]),
                            title="regime (time to target)")))
    layers.append(alt.Chart(_data([{"y": 1.0}])).mark_rule(color="#555", strokeDash=[2, 2]).encode(y="y:Q"))
    layers.append(_series(pts, series, x=x, y=y, ytitle=title, yscale=yscale, line_color=LINE_COLOR,
                          tooltip=[alt.Tooltip("batch:Q"), alt.Tooltip("series:N"),
                                   alt.Tooltip("time_to_target_ratio:Q", format=".3f"),
                                   alt.Tooltip("lo:Q", format=".3f", title="interval low"),
                                   alt.Tooltip("hi:Q", format=".3f", title="interval high"),
                                   alt.Tooltip("sigma:Q", format=".3f"),
                                   alt.Tooltip("rho:Q", format=".3f"), alt.Tooltip("regime:N")]))
    if marks:
        xr = alt.X("batch:Q", scale=xscale)
        for m in mark_labels(marks, extent):
            _, color, dash = MARK_STYLES[m["key"]]
            layers.append(alt.Chart(_data([m])).mark_rule(strokeWidth=2, color=color, strokeDash=dash).encode(
                x=xr, tooltip=["label:N"]))
            layers.append(alt.Chart(_data([m])).mark_text(align=m["align"], dx=m["dx"], baseline="top", fontSize=10,
                                                          fontWeight="bold", color=color).encode(
                x=xr, y=alt.value(m["y"]), text="label:N"))
    return alt.layer(*layers).resolve_scale(color="independent", shape="independent").properties(
        width=WIDTH, height=HEIGHT, title="Time to target vs batch size")


def sigma_rho_chart(rows: Sequence[Mapping[str, Any]], *, series: Sequence[str] = ()) -> alt.LayerChart:
    """sigma and rho vs batch, with their intervals as error bars and the configs whose T ratio is undecided ringed."""
    series = list(series)
    long = []
    for r in rows:
        for m in ("sigma", "rho"):
            if _finite(r.get(m)):
                iv = interval_of(r, m)
                long.append({"batch": batch_of(r), "metric": m, "value": float(r[m]), "series": series_label(r, series),
                             "lo": iv[0] if iv else None, "hi": iv[1] if iv else None, "regime": r.get("regime")})
    x = alt.X("batch:Q", scale=alt.Scale(type="log", base=2), title="responses per update B = P x G")
    title = "ratio to the reference config"
    yscale = alt.Scale(type="log", base=2)
    y = alt.Y("value:Q", scale=yscale, title=title)
    color = alt.Color("metric:N", title="metric",
                      scale=alt.Scale(domain=["sigma", "rho"], range=["#2b6cb0", "#b7312c"]))
    layers = [_series(long, series, x=x, y=y, ytitle=title, yscale=yscale, color=color,
                      ring_when="datum.metric === 'rho'",
                      tooltip=["batch:Q", "metric:N", alt.Tooltip("value:Q", format=".3f"),
                               alt.Tooltip("lo:Q", format=".3f", title="interval low"),
                               alt.Tooltip("hi:Q", format=".3f", title="interval high"), "series:N", "regime:N"])]
    return alt.layer(*layers).resolve_scale(shape="independent").properties(
        width=WIDTH, height=HEIGHT, title="Throughput gain sigma and sample cost rho vs batch size")


def split_label(row: Mapping[str, Any]) -> tuple[str, float, float]:
    """(label 'g:t', generation share, devices) of a row's device split; ('colocated', -1, 0) without one."""
    g, t = row.get("gen_gpus"), row.get("train_gpus")
    if not (_finite(g) and _finite(t)):
        return "colocated", -1.0, 0.0
    g, t = int(float(g)), int(float(t))
    return f"{g}:{t}", g / (g + t), float(g + t)


def split_chart(rows: Sequence[Mapping[str, Any]], *, series: Sequence[str] = ()) -> alt.LayerChart:
    """T_new / T_ref over the device split (generation : training devices, ordered by the generation share),
    one colour per staleness limit; other swept options (batch, partial rollout...) as line styles."""
    series = list(series)
    pts = []
    for r in rows:
        if not _finite(r.get("time_to_target_ratio")):
            continue
        label, share, total = split_label(r)
        eta = r.get("staleness")
        iv = interval_of(r, "time_to_target_ratio")
        pts.append({"split": label, "share": share, "devices": total,
                    "time_to_target_ratio": float(r["time_to_target_ratio"]),
                    "staleness": f"eta={float(eta) if _finite(eta) else 0.0:g}", "series": series_label(r, series),
                    "sigma": r.get("sigma"), "rho": r.get("rho"), "gen_idle_ratio": r.get("gen_idle_ratio"),
                    "train_idle_ratio": r.get("train_idle_ratio"), "regime": r.get("regime"),
                    "lo": iv[0] if iv else None, "hi": iv[1] if iv else None})
    order = [p["split"] for p in sorted(pts, key=lambda p: (p["share"], p["devices"]))]
    order = list(dict.fromkeys(order))
    etas = sorted({p["staleness"] for p in pts}, key=lambda s: float(s.split("=")[1]))
    x = alt.X("split:N", sort=order, title="generation : training devices", axis=alt.Axis(labelAngle=0))
    title = "T_new / T_ref = rho / sigma"
    yscale = alt.Scale(zero=False)
    y = alt.Y("time_to_target_ratio:Q", title=title, scale=yscale)
    color = alt.Color("staleness:N", sort=etas, title="staleness limit")  # one limit: named in the title instead
    layers = [alt.Chart(_data([{"y": 1.0}])).mark_rule(color="#555", strokeDash=[2, 2]).encode(y="y:Q")]
    layers.append(_series(pts, series, x=x, y=y, ytitle=title, yscale=yscale,
                          color=color if len(etas) > 1 else None, line_color=None if len(etas) > 1 else LINE_COLOR,
                          tooltip=["split:N", "staleness:N", "series:N",
                                   alt.Tooltip("time_to_target_ratio:Q", format=".3f"),
                                   alt.Tooltip("lo:Q", format=".3f", title="interval low"),
                                   alt.Tooltip("hi:Q", format=".3f", title="interval high"),
                                   alt.Tooltip("sigma:Q", format=".3f"), alt.Tooltip("rho:Q", format=".3f"),
                                   alt.Tooltip("gen_idle_ratio:Q", format=".1%"),
                                   alt.Tooltip("train_idle_ratio:Q", format=".1%"), "regime:N"]))
    name = "per staleness limit" if len(etas) > 1 else f"staleness limit {etas[0].split('=')[1]}" if etas else ""
    return alt.layer(*layers).resolve_scale(shape="independent").properties(
        width=WIDTH, height=HEIGHT, title="Time to target vs the device split" + (f", {name}" if name else ""))


def throughput_chart(points: Sequence[Mapping[str, Any]], curve: Sequence[Mapping[str, Any]] = (), *,
                     title: str = "Generation throughput vs concurrency") -> alt.LayerChart:
    """points: measured engine steps {num_running, tokens_per_s, prefill}; curve: {num_running, tokens_per_s}
    from the fitted model."""
    if len(points) > MAX_POINTS:
        idx = np.linspace(0, len(points) - 1, MAX_POINTS).astype(int)
        points = [points[i] for i in idx]
    x = alt.X("num_running:Q", scale=alt.Scale(type="log", base=2), title="running sequences in the engine step")
    y = alt.Y("tokens_per_s:Q", title="generated tokens / s")
    layers = [alt.Chart(_data(points)).mark_circle(size=14, opacity=0.45).encode(
        x=x, y=y, color=alt.Color("step:N", title="measured step", scale=alt.Scale(domain=["decode", "with prefill"],
                                                                                    range=["#4c78a8", "#f58518"])),
        tooltip=["num_running:Q", alt.Tooltip("tokens_per_s:Q", format=".0f"), "step:N"])]
    if curve:
        layers.append(alt.Chart(_data(curve)).mark_line(color="#b7312c", strokeWidth=2.5).encode(
            x=x, y=y, tooltip=["num_running:Q", alt.Tooltip("tokens_per_s:Q", format=".0f")]))
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT,
                                         title=title + (" (line: fitted model)" if curve else ""))


def measured_throughput_points(trace) -> list[dict]:
    g = trace.rows("gen_step")
    dur = np.asarray(g["duration"], dtype=float)
    ok = dur > 0
    n = np.asarray(g["num_running"], dtype=float)[ok]
    dec = np.asarray(g["decode_tokens"], dtype=float)[ok]
    pre = np.asarray(g["prefill_tokens"], dtype=float)[ok]
    tps = dec / dur[ok]
    return [{"num_running": float(a), "tokens_per_s": float(b), "step": "with prefill" if p > 0 else "decode"}
            for a, b, p in zip(n, tps, pre) if a > 0 and b > 0]


def learning_chart(curves: Mapping[str, Sequence[tuple[float, float]]], *,
                   target: float | None = None) -> alt.LayerChart:
    """curves: trace name -> [(cum_responses, score)]."""
    rows = [{"trace": name, "cum_responses": float(x), "score": float(y)} for name, pts in curves.items()
            for x, y in pts]
    one = len(curves) == 1  # one trace: named in the title, not in a one-entry legend
    layers = [alt.Chart(_data(rows)).mark_line(point=True).encode(
        x=alt.X("cum_responses:Q", title="cumulative training responses"),
        y=alt.Y("score:Q", title="held-out score (mean@k)", scale=alt.Scale(zero=False)),
        color=alt.value(LINE_COLOR) if one else alt.Color("trace:N", title="trace"),
        tooltip=["trace:N", "cum_responses:Q", alt.Tooltip("score:Q", format=".3f")])]
    if target is not None and _finite(target):
        layers.append(alt.Chart(_data([{"target": float(target), "label": f"target {target:.3g}"}])).mark_rule(
            strokeDash=[4, 3], color="#555").encode(y="target:Q", tooltip=["label:N"]))
    title = "Learning curves vs cumulative responses" + (f": {next(iter(curves))}" if one else "")
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT, title=title)


def trace_learning_curves(traces: Sequence[Any]) -> dict[str, list[tuple[float, float]]]:
    out = {}
    for t in traces:
        e = t.rows("eval")
        cfg = t.config
        label = t.name
        if "prompts" in cfg:
            label += f" (P={cfg.get('prompts')}, G={cfg.get('group', 1)})"
        pts = sorted(zip(np.asarray(e["cum_responses"], float), np.asarray(e["score"], float)))
        out[label] = [(x, y) for x, y in pts if math.isfinite(x) and math.isfinite(y)]
    return out


def merge_spans(spans: Sequence[Any], *, gap: float = 1e-9) -> list[dict]:
    """Gantt bars: per lane and kind, touching slices (consecutive engine steps) merged into one bar.
    Responses, generation rounds and RL steps are left out (the engine steps and phases already show them)."""
    by = {}
    for s in sorted(spans, key=lambda s: (s.lane, s.track, s.start)):
        if s.track in ("response", "gen_round", "rl_step"):
            continue
        by.setdefault((s.lane, s.track), []).append(s)
    bars = []
    for (lane, kind), group in by.items():
        cur = None
        for s in group:
            if cur and s.start <= cur["end"] + gap:
                cur["end"] = max(cur["end"], s.start + s.dur)
                cur["slices"] += 1
            else:
                cur = {"lane": lane, "kind": kind, "start": s.start, "end": s.start + s.dur, "slices": 1}
                bars.append(cur)
    return bars


def gantt_chart(spans: Sequence[Any], counters: Sequence[Any] = (), *, title: str = "Simulated timeline",
                until: float | None = None) -> alt.VConcatChart | alt.Chart:
    """spans: `Slice`s, counters: `Counter`s (rlsim.replay.timeline; gen.running is drawn)."""
    bars = merge_spans([s for s in spans if until is None or s.start <= until])
    for b in bars:
        b["duration_s"] = b["end"] - b["start"]
    lanes = sorted({b["lane"] for b in bars}, key=lane_key)
    gantt = alt.Chart(_data(bars)).mark_bar(height=18).encode(
        x=alt.X("start:Q", title="seconds from start"), x2="end:Q",
        y=alt.Y("lane:N", sort=lanes, title=None),
        color=alt.Color("kind:N", title="activity"),
        tooltip=["lane:N", "kind:N", alt.Tooltip("start:Q", format=".3f"), alt.Tooltip("duration_s:Q", format=".4f"),
                 "slices:Q"],
    ).properties(width=WIDTH + 140, height=36 * max(len(lanes), 1), title=title)
    run = sorted(({"t": c.t, "running": c.value} for c in counters
                  if c.name == "gen.running" and (until is None or c.t <= until)),
                 key=lambda r: r["t"])
    if len(run) > MAX_POINTS:
        idx = np.linspace(0, len(run) - 1, MAX_POINTS).astype(int)
        run = [run[i] for i in idx]
    if not run:
        return gantt
    line = alt.Chart(_data(run)).mark_line(interpolate="step-after", color="#4c78a8").encode(
        x=alt.X("t:Q", title="seconds from start"), y=alt.Y("running:Q", title="running seqs"),
    ).properties(width=WIDTH + 140, height=90)
    return alt.vconcat(gantt, line).resolve_scale(x="shared")


def save_chart(chart: alt.TopLevelMixin, out_dir: str | os.PathLike, stem: str, *, png: bool = True,
               scale: float = 1.5) -> dict[str, Path]:
    """Write `<stem>.html` (Vega, Vega-Lite and vega-embed inlined: opens with no network) and `<stem>.png`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"html": out_dir / f"{stem}.html"}
    chart.save(str(paths["html"]), format="html", inline=True)
    if png:
        paths["png"] = out_dir / f"{stem}.png"
        chart.save(str(paths["png"]), format="png", scale_factor=scale)
    return paths


def png_size(path: str | os.PathLike) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; ValueError if the file is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG file")
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
