"""The one-page self-contained HTML report: trace summary, fitted models with their fit quality, every
chart of the study (rlsim.present.views), and the sweep's ranking. The Vega / Vega-Lite / vega-embed bundle is
inlined once (from vl-convert), so the page opens with no network.
"""
from __future__ import annotations

import datetime as _dt
import html
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from rlsim.replay.errors import RlsimError
from rlsim.replay.models import FittedModels, GenStepModel
from rlsim.replay.robust import PiecewiseLinear
from rlsim.replay.steps import step_table
from rlsim.replay.util import atomic_write, fmt
from rlsim.present.results import read_results, trace_identity
from rlsim.present.tables import (NOT_FITTING, RANGED, config_warning_items, describe, fits_text, interval, own,
                                  plan_lines, shown_column, sweep_verdict, varying, with_interval)
from rlsim.present.views import CHARTS, OPTIONAL_CHARTS, axes_of, build_charts
from rlsim.whatif.study import prepare

TABLE_COLUMNS = (("responses_per_s", "resp/s", ".1f"), ("step_time_s", "step s", ".3f"), ("gen_s", "gen s", ".3f"),
                 ("train_s", "train s", ".3f"), ("sync_s", "sync s", ".4f"), ("sigma", "sigma", ".3f"),
                 ("rho", "rho", ".3f"), ("time_to_target_ratio", "T ratio", ".3f"), ("regime", "regime", ""),
                 ("fits", "fits in memory", ""), ("expected_regret", "expected regret", "%"))

# ----------------------------------------------------------------------------------------------
# report


def trace_summary(trace: Any) -> dict[str, Any]:
    st = step_table(trace)
    e = trace.rows("eval")
    counts = {k: trace.count(k) for k in ("gen_step", "response", "update", "sync", "eval")}
    t_end = float(np.nanmax(trace.table["t_start"].to_numpy(zero_copy_only=False))) if trace.table.num_rows else 0.0
    ok = np.isfinite(st["step_time"]) & (st["step_time"] > 0)
    return {
        "path": str(trace.path), "status": trace.meta.get("status"), "recovered": bool(trace.recovered),
        "rows": counts, "duration_s": t_end,
        "mean_step_time_s": float(np.mean(st["step_time"][ok])) if ok.any() else None,
        "mean_gen_time_s": float(np.mean(st["gen_time"][ok])) if ok.any() else None,
        "responses_per_s": float(st["num_responses"][ok].sum() / st["step_time"][ok].sum()) if ok.any() else None,
        "best_score": float(np.max(e["score"])) if len(e["score"]) else None,
        "final_score": float(e["score"][np.argmax(e["cum_responses"])]) if len(e["score"]) else None,
        "max_running": int(np.max(trace.rows("gen_step")["num_running"])) if counts["gen_step"] else None,
    }


def _kv_table(d: Mapping[str, Any]) -> str:
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>"
                   f"{html.escape(fmt(v) if not isinstance(v, (dict, list)) else json.dumps(v, default=str))}</td></tr>"
                   for k, v in d.items())
    return f"<table class='kv'>{rows}</table>"


def _table(header: Sequence[str], body: Sequence[Sequence[Any]], cls: str = "grid") -> str:
    h = "".join(f"<th>{html.escape(str(x))}</th>" for x in header)
    b = "".join("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in r) + "</tr>" for r in body)
    return f"<table class='{cls}'><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>"


def _dur(seconds: float) -> str:
    """Seconds in the unit that reads best (s, ms, &micro;s, ns)."""
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "&micro;s")):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds * 1e9:.4g} ns"


def _gen_equation(g: GenStepModel) -> str:
    """The engine-step cost as an equation; with more than two hinges (the interpolated form), f(running) at the
    ends of the fitted range and at each knee."""
    lo, hi = g.concurrency_range
    rest = f"{_dur(g.c_ctx)} &times; context tokens + {_dur(g.c_prefill)} &times; prefill tokens"
    if len(g.hinges) > 2:
        at = [lo] + [k for k in g.knees if lo < k < hi] + [hi]
        f = ", ".join(f"{n:.0f}: {_dur(float(g.step(n, 0.0)))}" for n in at)
        return (f"t_step = f(running) + {rest}; f non-decreasing, piecewise linear through {len(g.hinges) + 2} "
                f"measured levels (straight beyond {lo}..{hi}): {f}")
    knees = "".join(f" + {_dur(d)} &times; max(0, running &minus; {k:.0f})" for k, d in g.hinges)
    return (f"t_step = {_dur(g.c_step)} + {_dur(g.c_seq)} &times; running + {rest}{knees}"
            f"{' (fixed term from the roofline prior)' if g.prior else ''}; fitted on concurrency {lo}..{hi}")


def _update_equation(u: PiecewiseLinear) -> str:
    """The interpolated update model: its fixed cost and forward + backward seconds at each token level."""
    at = ", ".join(f"{x:.0f}: {_dur(v)}" for x, v in zip(u.knots, u.values))
    return (f"t_update = {_dur(u.offset)} + g(tokens); g (forward + backward) non-decreasing, piecewise linear through "
            f"the calibration's token levels (straight beyond them): {at}")


def models_section(fitted: FittedModels) -> str:
    g = fitted.gen
    parts = ["<h3>Generation step cost</h3>", f"<p class='eq'>{_gen_equation(g)}</p>"]
    if isinstance(fitted.update, PiecewiseLinear):
        parts += ["<h3>Update cost</h3>", f"<p class='eq'>{_update_equation(fitted.update)}</p>"]
    aff = [(m.name, m.x_name, f"{m.intercept:.4g}", f"{m.slope:.4g}") for m in
           (fitted.update, fitted.prep, fitted.reward, fitted.other, fitted.sync) if not isinstance(m, PiecewiseLinear)]
    o = fitted.gen_overhead
    parts.append("<h3>Other cost models (seconds = intercept + slope &times; x)</h3>")
    parts.append(_table(["model", "x", "intercept", "slope"], aff +
                        [("gen overhead", "responses, steps", f"{o.base:.4g}",
                          f"{o.per_response:.4g}, {o.per_step:.4g}")]))
    val = fitted.validation
    cv = {"gen_step": (val.gen_cv, val.gen_form), "update": (val.train_cv, "")} if val is not None else {}
    q = [(name, fq.n, fmt(fq.r2, ".4f"), fmt(fq.rmse, ".3g"), fmt(fq.median_rel_err, ".2%"),
          fmt(fq.p95_rel_err, ".2%"), fmt(cv.get(name, (None,))[0], ".2%"), fq.dropped, fq.method)
         for name, fq in fitted.quality.items()]
    parts.append("<h3>Fit quality</h3>")
    parts.append(_table(["model", "rows", "R²", "RMSE (s)", "median |rel err|", "p95 |rel err|",
                         "cross-validated |rel err| (RMS, held-out levels)", "dropped", "method"], q))
    if val is not None:
        parts.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in list(val.summary()) + list(val.notes)
                                      + [f"intervals: {val.interval_method}"]) + "</ul>")
    ln = fitted.lengths
    parts.append(f"<p>Response lengths: mean {ln.mean_response:.1f} tokens, p50 {np.median(ln.response_tokens):.0f}, "
                 f"p95 {np.percentile(ln.response_tokens, 95):.0f}, cap {ln.max_tokens}; prompt lengths mean "
                 f"{np.mean(ln.prompt_tokens):.1f}.</p>")
    if fitted.warnings:
        parts.append("<ul class='warn'>" + "".join(f"<li>{html.escape(w)}</li>" for w in fitted.warnings) + "</ul>")
    return "\n".join(parts)


def _cell(r: Mapping[str, Any], key: str, spec: str) -> str:
    """A table cell's HTML: the value, its interval (where there is one) under it; 'undecided' marked."""
    if key == "regime":
        reg = str(r.get(key) if r.get(key) is not None else "-")
        return f"<span class='undecided'>{html.escape(reg)}</span>" if reg == "undecided" else html.escape(reg)
    if key == "fits":
        return "<span class='undecided'>no</span>" if r.get(key) is False else fits_text(r.get(key))
    v = html.escape(fmt(r.get(key), spec))
    iv = interval(r, key) if key in RANGED else None
    if iv:
        v += f"<br><span class='iv'>{html.escape(fmt(iv[0], spec))}..{html.escape(fmt(iv[1], spec))}</span>"
    return v


def _html_table(header: Sequence[str], body: Sequence[tuple[str, Sequence[str]]], cls: str = "grid") -> str:
    """Like _table, but the cells are HTML already; each body row is (row class, cells)."""
    h = "".join(f"<th>{html.escape(str(x))}</th>" for x in header)
    b = "".join(f"<tr class='{c}'>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>" for c, cells in body)
    return f"<table class='{cls}'><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>"


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _items_html(xs: Sequence[str]) -> str:
    return "".join(f"<li>{html.escape(x)}</li>" for x in xs)


def summary_section(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    """The headline: the verdict as `rlsim sweep` prints it (best, undecided between, may not beat the
    reference) with intervals, the first-ranked config's numbers, the caveats (warnings) in a box, and the
    notes on how the numbers were made folded away."""
    axes = varying(rows, axes_of(meta, rows))  # the options that were swept name a config
    opts = (meta.get("grid") or {}).get("options") or {}
    v = sweep_verdict(rows, meta, describe_row=lambda r: describe(r, axes, opts))
    best, ref = v["best"] or rows[0], meta.get("reference") or {}
    cls = "verdict clear" if v["kind"] == "clear" else "verdict undecided-box"
    parts = [f"<div class='{cls}'><p class='headline'><b>{html.escape(v['title'])}</b>: {html.escape(v['text'])}.</p>"]
    parts.append(f"<p>Ranked first: <b>{html.escape(describe(best, axes, opts))}</b> "
                 f"(B = {fmt(best.get('responses_per_update'))} responses per update): T / T_ref = "
                 f"{html.escape(with_interval(best, 'time_to_target_ratio', '.3f'))} "
                 f"({html.escape(str(best.get('regime')))}), sigma {html.escape(with_interval(best, 'sigma', '.3f'))}, "
                 f"rho {html.escape(with_interval(best, 'rho', '.3f'))} ({html.escape(str(best.get('rho_model')))}), "
                 f"{html.escape(with_interval(best, 'responses_per_s', '.1f'))} responses/s"
                 + (f" against {fmt(ref.get('responses_per_s'), '.1f')} for the reference (P={ref.get('prompts')}, "
                    f"G={ref.get('group')})" if ref else "") + ".</p></div>")
    parts += [f"<p class='plan'>{html.escape(line)}</p>" for line in plan_lines(meta)]
    others = [r for r in rows if r is not best and all(r is not t for t in v["tied"]) and own(r, "warnings", meta)]
    warns = [html.escape(w) for w in v["warnings"]]
    warns += [f"<b>{html.escape(configs)}</b>: {html.escape(w)}" for configs, w in config_warning_items(v)]
    if others:
        many = len(others) > 1
        warns.append(html.escape(f"{_count(len(others), 'other config')} {'have' if many else 'has'} warnings of "
                                 f"{'their' if many else 'its'} own: see the caveats column of the ranking"))
    if warns:
        items = "".join(f"<li>{w}</li>" for w in warns)  # escaped above
        parts.append(f"<div class='warnbox'><b>Caveats ({len(warns)})</b><ul>{items}</ul></div>")
    if v["notes"]:
        parts.append("<details class='notes'><summary>How these numbers were made "
                     f"({_count(len(v['notes']), 'note')})</summary><ul>{_items_html(v['notes'])}</ul></details>")
    return "\n".join(parts)


def ranking_section(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], *, limit: int = 200) -> str:
    axes = axes_of(meta, rows)
    cols = [c for c in TABLE_COLUMNS if shown_column(rows, c[0])]
    shown = list(rows[:limit])
    opts = (meta.get("grid") or {}).get("options") or {}
    v = sweep_verdict(rows, meta, describe_row=lambda r: describe(r, varying(rows, axes), opts))
    lead = {id(r) for r in [v["best"]] + v["tied"] if r is not None}
    warn_ids: dict[str, int] = {}
    notes: dict[str, list] = {}
    body = []
    for r in shown:
        ws = own(r, "warnings", meta)  # the study's warnings, which every row repeats, are in the summary
        for w in ws:
            warn_ids.setdefault(w, len(warn_ids) + 1)
        for n in own(r, "notes", meta):
            notes.setdefault(n, []).append(str(r.get("rank")))
        refs = ", ".join(f"<a href='#caveat-{warn_ids[w]}'>{warn_ids[w]}</a>" for w in ws)
        cells = ([html.escape(str(r.get("rank")))] + [html.escape(fmt(r.get(a))) for a in axes]
                 + [_cell(r, k, f) for k, _, f in cols] + [refs or "-"])
        body.append(("lead" if id(r) in lead else "", cells))
    grid = (meta.get("grid") or {})
    desc = "; ".join(f"{(grid.get('options') or {}).get(a, a)} {', '.join(map(str, vals))}"
                     for a, vals in (grid.get("axes") or {}).items())
    head = (f"<p>{len(rows)} configs ({html.escape(desc)}); ranked by T_new / T_ref = rho / sigma, smallest first. "
            "Intervals under the values (where the fit has them); highlighted: the config(s) the headline names. "
            "A config whose T interval spans 1 is <span class='undecided'>undecided</span>; `reference` is the trace's "
            "own config (T / T_ref = 1).")
    if any(r.get("fits") is False for r in rows):
        head += " " + NOT_FITTING.replace("fits no:", "A config marked <i>no</i> under fits in memory:") + "."
    if len(rows) > limit:
        head += f" The best {limit} are shown; all are in results.csv."
    head += "</p>"
    if not warn_ids:  # no config has warnings of its own: no column of dashes
        body = [(c, cells[:-1]) for c, cells in body]
    out = head + _html_table(["rank", *axes, *[c[1] for c in cols]] + (["caveats"] if warn_ids else []), body)
    if warn_ids:
        out += ("<p><b>Caveats of the configs</b> (numbers in the caveats column):</p><ol class='warn caveats'>"
                + "".join(f"<li id='caveat-{i}'>{html.escape(w)}</li>" for w, i in warn_ids.items()) + "</ol>")
    if notes:
        out += ("<details class='notes'><summary>Notes per config: how their numbers were made "
                f"({len(notes)})</summary><ul>"
                + "".join(f"<li>{html.escape(n)} <span class='muted'>(rank {', '.join(rs)})</span></li>"
                          for n, rs in notes.items())
                + "</ul></details>")
    return out


def _chart_div(name: str, title: str, spec: dict) -> str:
    js = json.dumps(spec, allow_nan=False).replace("</", "<\\/")
    return (f"<section class='chart' id='chart-{name}'><h3>{html.escape(title)}</h3><div id='vis-{name}'></div>"
            f"<script type='application/json' id='spec-{name}'>{js}</script></section>")


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;
  color:#222;padding:0 1em}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0;font-size:13px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
table.kv th{text-align:left;background:#f6f6f6} table.grid thead th{background:#f0f3f7;position:sticky;top:0}
.eq{font-family:ui-monospace,monospace;background:#f7f7f7;padding:.5em} .warn{color:#9a5b00} .muted{color:#777}
section.chart{margin:1.5em 0}
.verdict{border-left:5px solid #2f855a;background:#f0f9f3;padding:.4em 1em;margin:.8em 0} .verdict p{margin:.4em 0}
.verdict.undecided-box{border-left-color:#c27c0e;background:#fff8e6} .headline{font-size:17px}
.warnbox{border:1px solid #e3b341;background:#fffbea;color:#6b4500;padding:.4em 1em;margin:.8em 0}
.warnbox ul{margin:.3em 0;padding-left:1.3em} .undecided{color:#a05a00;font-weight:600}
.iv{color:#777;font-size:11px;white-space:nowrap} tr.lead td{background:#eef5fc}
details.notes{font-size:13px;color:#555;margin:.6em 0} details.notes summary{cursor:pointer}
ol.caveats{font-size:13px}
"""


def build_report(traces: Sequence[Any], sweep_dir: str | os.PathLike | None, out: str | os.PathLike, *,
                 rho_model: str | None = None, target: float | None = None, calibration: Sequence[Any] = ()) -> Path:
    """Write the report for the traces (read; the first is the reference); returns its path."""
    import vl_convert as vlc  # why here: the chart renderer (vl-convert) loads only when a report is drawn

    if not traces:
        raise RlsimError("give a trace with --trace")
    rows, meta = read_results(sweep_dir) if sweep_dir is not None else ([], {})
    study_opts = dict(meta.get("study") or {})
    if rho_model is not None:
        study_opts["rho_model"] = rho_model
    if target is not None:
        study_opts["target"] = target
    if meta.get("traces"):
        swept = {t.get("sha256") for t in meta["traces"]}
        mine = {trace_identity(t)["sha256"] for t in traces}
        if not mine & swept:
            raise RlsimError(f"the sweep in {sweep_dir} was run on other traces "
                             f"({', '.join(t['path'] for t in meta['traces'])}); pass the same --trace")
    study = prepare(traces, rho_model=study_opts.get("rho_model") or "auto", target=study_opts.get("target"),
                    calibration=calibration)
    fitted = study.models
    charts = build_charts(traces=traces, study=study, rows=rows, meta={**meta, "study": study_opts})

    parts = [f"<h1>rlsim report</h1><p class='muted'>generated {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC}"
             f"{' from sweep ' + html.escape(str(sweep_dir)) if sweep_dir else ''}</p>"]
    if rows:
        parts.append("<h2 id='summary'>Summary</h2>" + summary_section(rows, meta))
        parts.append("<h2 id='ranking'>Sweep ranking</h2>" + ranking_section(rows, meta))
    parts.append("<h2 id='traces'>Traces</h2>")
    for t in traces:
        s = trace_summary(t)
        ident = trace_identity(t)
        parts.append(f"<h3>{html.escape(t.name)}</h3>")
        parts.append(_kv_table({"path": s["path"], "sha256": ident["sha256"], "status": s["status"],
                                "rows": s["rows"], "recorded seconds": s["duration_s"],
                                "mean step time (s)": s["mean_step_time_s"],
                                "mean generation time (s)": s["mean_gen_time_s"],
                                "responses / s": s["responses_per_s"], "max running sequences": s["max_running"],
                                "best eval score": s["best_score"], "final eval score": s["final_score"],
                                "config": t.config, "engine": t.meta.get("engine", {}),
                                "model": t.meta.get("model", {}), "hardware": t.meta.get("hardware", {})}))
    parts.append("<h2 id='models'>Fitted models</h2>" + models_section(fitted))
    parts.append("<h2 id='charts'>Charts</h2>")
    titles = dict(CHARTS + OPTIONAL_CHARTS)
    for name, chart in charts.items():
        parts.append(_chart_div(name, titles.get(name, name), chart.to_dict()))
    names = json.dumps(list(charts))
    script = ("<script>(function(){for(const n of " + names
              + "){const s=JSON.parse(document.getElementById('spec-'+n).textContent);"
              "vegaEmbed('#vis-'+n,s,{mode:'vega-lite',actions:{export:true,source:false,compiled:false,editor:false}})"
              ".catch(e=>{document.getElementById('vis-'+n).textContent='chart failed: '+e;});}})();</script>")
    bundle = vlc.javascript_bundle().replace("</script", "<\\/script")
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>rlsim report</title>"
            f"<style>{CSS}</style><script type='text/javascript'>{bundle}</script></head><body>"
            + "\n".join(parts) + script + "</body></html>")
    return atomic_write(out, page)

