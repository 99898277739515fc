"""Altair charts of a study, saved as self-contained HTML (Vega JS inlined) and PNG (vl-convert).

Every chart function takes plain rows (dicts) so the same charts serve `rlsim sweep` (results rows),
`rlsim report` and tests:

- `time_to_target_chart`: T_new / T_ref vs batch with the three regimes shaded and the critical
  generation and training batches marked;
- `sigma_rho_chart`: sigma and rho vs batch;
- `throughput_chart`: generation throughput vs concurrency, measured engine steps with the fitted
  step-cost model drawn over them;
- `learning_chart`: eval score vs cumulative training responses, one line per trace;
- `split_chart`: T_new / T_ref over the generation : training device split, one line per staleness limit;
- `gantt_chart`: the timeline of one simulated (or recorded) run: generation / training / sync lanes
  per device, with the running-sequences counter under it.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import altair as alt
import numpy as np

from rlsim.replay.timeline import lane_key
from rlsim.replay.util import json_safe

REGIME_COLORS = {"falls": "#c7e9c0", "flat": "#fdf5c4", "rises": "#fcc5c0"}
WIDTH, HEIGHT = 560, 300
MAX_POINTS = 4000


def _data(rows: Sequence[Mapping[str, Any]]) -> alt.Data:
    return alt.Data(values=[{k: json_safe(v) for k, v in r.items()} for r in rows])


def _finite(x: Any) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def regime_key(regime: Any) -> str | None:
    """Map a regime label (`time falls`, `flat`, `time rises`) to falls / flat / rises; None if unknown."""
    s = str(regime or "").lower()
    for k in ("falls", "rises", "flat"):
        if k in s:
            return k
    return None


def batch_of(row: Mapping[str, Any]) -> float:
    """Responses per update B = P x G."""
    if _finite(row.get("batch")):
        return float(row["batch"])
    return float(row["prompts"]) * float(row.get("group") or 1)


def series_label(row: Mapping[str, Any], keys: Sequence[str]) -> str:
    return ", ".join(f"{k}={row.get(k)}" for k in keys) or "all"


def varying_keys(rows: Sequence[Mapping[str, Any]], axes: Iterable[str], exclude: Iterable[str] = ("prompts",)) -> list[str]:
    """Grid axes (other than the batch) that take more than one value: each combination is one series."""
    ex = set(exclude)
    out = []
    for k in axes:
        if k in ex:
            continue
        if len({repr(r.get(k)) for r in rows}) > 1:
            out.append(k)
    return out


def regime_bands(points: Sequence[tuple[float, str]]) -> list[dict]:
    """Contiguous batch ranges with one regime, split at the geometric midpoint between neighbours."""
    pts = sorted((b, regime_key(r)) for b, r in points if b > 0 and regime_key(r) is not None)
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


def critical_batches(rows: Sequence[Mapping[str, Any]], *, plateau: float = 0.9, invariance: float = 1.1) -> dict[str, float | None]:
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


def primary_series(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], prefer: Mapping[str, Any] | None) -> list[Mapping]:
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
                         prefer: Mapping[str, Any] | None = None, reference_batch: float | None = None) -> alt.LayerChart:
    series = list(series)
    pts = [dict(r, batch=batch_of(r), series=series_label(r, series)) for r in rows if _finite(r.get("time_to_target_ratio"))]
    primary = primary_series(pts, series, prefer)
    bands = regime_bands([(r["batch"], r.get("regime")) for r in primary])
    crit = dict(critical or critical_batches(primary))
    x = alt.X("batch:Q", scale=alt.Scale(type="log", base=2), title="batch B = P x G (responses per update)")
    layers = []
    if bands:
        layers.append(alt.Chart(_data(bands)).mark_rect(opacity=0.55).encode(
            x=alt.X("x0:Q", scale=alt.Scale(type="log", base=2)), x2="x1:Q",
            color=alt.Color("regime:N", scale=alt.Scale(domain=list(REGIME_COLORS), range=list(REGIME_COLORS.values())),
                            title="regime (time to target)")))
    layers.append(alt.Chart(_data([{"y": 1.0}])).mark_rule(color="#555", strokeDash=[2, 2]).encode(y="y:Q"))
    layers.append(alt.Chart(_data(pts)).mark_line(point=True).encode(
        x=x, y=alt.Y("time_to_target_ratio:Q", title="T_new / T_ref = rho / sigma", scale=alt.Scale(zero=False)),
        strokeDash=alt.StrokeDash("series:N", title=", ".join(series) or "series"),
        tooltip=[alt.Tooltip("batch:Q"), alt.Tooltip("series:N"), alt.Tooltip("time_to_target_ratio:Q", format=".3f"),
                 alt.Tooltip("sigma:Q", format=".3f"), alt.Tooltip("rho:Q", format=".3f"), alt.Tooltip("regime:N")]))
    marks = [{"batch": v, "label": lab} for key, lab in (("critical_gen_batch", "critical generation batch"),
                                                         ("critical_train_batch", "critical training batch"))
             if _finite(v := crit.get(key))]
    if reference_batch:
        marks.append({"batch": float(reference_batch), "label": "reference (trace)"})
    if marks:
        layers.append(alt.Chart(_data(marks)).mark_rule(strokeWidth=2).encode(
            x=alt.X("batch:Q", scale=alt.Scale(type="log", base=2)),
            stroke=alt.Stroke("label:N", scale=alt.Scale(domain=["critical generation batch", "critical training batch",
                                                                  "reference (trace)"],
                                                          range=["#2b6cb0", "#b7312c", "#777777"]), title="marks")))
        layers.append(alt.Chart(_data(marks)).mark_text(angle=270, align="left", dx=4, dy=-4, fontSize=10).encode(
            x=alt.X("batch:Q", scale=alt.Scale(type="log", base=2)), y=alt.value(4), text="label:N"))
    return alt.layer(*layers).resolve_scale(color="independent", stroke="independent").properties(
        width=WIDTH, height=HEIGHT, title="Time to target vs batch size")


def sigma_rho_chart(rows: Sequence[Mapping[str, Any]], *, series: Sequence[str] = ()) -> alt.Chart:
    series = list(series)
    long = []
    for r in rows:
        for m in ("sigma", "rho"):
            if _finite(r.get(m)):
                long.append({"batch": batch_of(r), "metric": m, "value": float(r[m]),
                             "series": series_label(r, series)})
    return alt.Chart(_data(long)).mark_line(point=True).encode(
        x=alt.X("batch:Q", scale=alt.Scale(type="log", base=2), title="batch B = P x G (responses per update)"),
        y=alt.Y("value:Q", scale=alt.Scale(type="log", base=2), title="ratio to the reference config"),
        color=alt.Color("metric:N", title="metric", scale=alt.Scale(domain=["sigma", "rho"], range=["#2b6cb0", "#b7312c"])),
        strokeDash=alt.StrokeDash("series:N", title=", ".join(series) or "series"),
        tooltip=["batch:Q", "metric:N", alt.Tooltip("value:Q", format=".3f"), "series:N"],
    ).properties(width=WIDTH, height=HEIGHT, title="Throughput gain sigma and sample cost rho vs batch size")


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
        pts.append({"split": label, "share": share, "devices": total, "time_to_target_ratio": float(r["time_to_target_ratio"]),
                    "staleness": f"eta={int(float(eta)) if _finite(eta) else 0}", "series": series_label(r, series),
                    "sigma": r.get("sigma"), "rho": r.get("rho"), "gen_idle_ratio": r.get("gen_idle_ratio"),
                    "train_idle_ratio": r.get("train_idle_ratio")})
    order = [p["split"] for p in sorted(pts, key=lambda p: (p["share"], p["devices"]))]
    order = list(dict.fromkeys(order))
    etas = sorted({p["staleness"] for p in pts}, key=lambda s: int(s.split("=")[1]))
    x = alt.X("split:N", sort=order, title="generation : training devices", axis=alt.Axis(labelAngle=0))
    layers = [alt.Chart(_data([{"y": 1.0}])).mark_rule(color="#555", strokeDash=[2, 2]).encode(y="y:Q"),
              alt.Chart(_data(pts)).mark_line(point=True).encode(
                  x=x, y=alt.Y("time_to_target_ratio:Q", title="T_new / T_ref = rho / sigma", scale=alt.Scale(zero=False)),
                  color=alt.Color("staleness:N", sort=etas, title="staleness limit"),
                  strokeDash=alt.StrokeDash("series:N", title=", ".join(series) or "series"),
                  detail="series:N",
                  tooltip=["split:N", "staleness:N", "series:N", alt.Tooltip("time_to_target_ratio:Q", format=".3f"),
                           alt.Tooltip("sigma:Q", format=".3f"), alt.Tooltip("rho:Q", format=".3f"),
                           alt.Tooltip("gen_idle_ratio:Q", format=".1%"), alt.Tooltip("train_idle_ratio:Q", format=".1%")])]
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT,
                                         title="Time to target vs the device split, per staleness limit")


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
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT, title=title + (" (line: fitted model)" if curve else ""))


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


def learning_chart(curves: Mapping[str, Sequence[tuple[float, float]]], *, target: float | None = None) -> alt.LayerChart:
    """curves: trace name -> [(cum_responses, score)]."""
    rows = [{"trace": name, "cum_responses": float(x), "score": float(y)} for name, pts in curves.items() for x, y in pts]
    layers = [alt.Chart(_data(rows)).mark_line(point=True).encode(
        x=alt.X("cum_responses:Q", title="cumulative training responses"),
        y=alt.Y("score:Q", title="held-out score (mean@k)", scale=alt.Scale(zero=False)),
        color=alt.Color("trace:N", title="trace"), tooltip=["trace:N", "cum_responses:Q", alt.Tooltip("score:Q", format=".3f")])]
    if target is not None and _finite(target):
        layers.append(alt.Chart(_data([{"target": float(target), "label": f"target {target:.3g}"}])).mark_rule(
            strokeDash=[4, 3], color="#555").encode(y="target:Q", tooltip=["label:N"]))
    return alt.layer(*layers).properties(width=WIDTH, height=HEIGHT, title="Learning curves vs cumulative responses")


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
    run = sorted(({"t": c.t, "running": c.value} for c in counters if c.name == "gen.running" and (until is None or c.t <= until)),
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
