"""The terminal ranking table of a sweep (rich), and the verdict every ranking output shares (the sweep's
terminal summary, the report's headline): intervals, "undecided", warnings (something may be wrong) kept
apart from notes (how the answer was made)."""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from rlsim.replay.rho import regime_key
from rlsim.replay.util import fmt

TERMINAL_COLUMNS = (("responses_per_update", "B", ""), ("responses_per_s", "resp/s", ".1f"), ("sigma", "sigma", ".3f"),
                    ("rho", "rho", ".3f"), ("time_to_target_ratio", "T ratio", ".3f"), ("regime", "regime", ""),
                    ("fits", "fits", ""),  # only when a config does not fit in memory
                    ("expected_regret", "exp. regret", "%"))  # the last: only when the sweep has a plan
RANGED = ("responses_per_s", "sigma", "rho", "time_to_target_ratio")  # the fields with `_lo` / `_hi` intervals
SHORT_SPEC = {".3f": ".2f", ".1f": ".0f"}  # the terminal table's intervals, one digit shorter: it fits 80 columns
REGIME_BAND = 0.05  # without intervals, configs whose T ratios lie within 5% are not told apart (regime's "flat" band)
NO_INTERVAL = ("no interval: T / T_ref is a point estimate, so how far it can be off is unknown (throughput intervals "
               "come from refitting the recorded hardware's costs: none for rescaled devices or split runs)")


NOT_FITTING = ("fits no: the memory model says the config does not fit its devices; ranked after every config that "
               "fits, never the verdict (its warning names the term that overflows and what would fit)")


def shown_column(rows: Sequence[Mapping[str, Any]], key: str) -> bool:
    """Whether a ranking shows column `key`: when a row has it; `fits` only when a config does not fit."""
    if key == "fits":
        return any(r.get("fits") is False for r in rows)
    return any(key in r for r in rows)


def fits_text(v: Any) -> str:
    """A `fits` cell: yes, no, or ? (unknown)."""
    return "yes" if v is True else "no" if v is False else "?"


def num(v: Any) -> float | None:
    """A finite float, or None (missing, None, NaN, text)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def interval(row: Mapping[str, Any], key: str) -> tuple[float, float] | None:
    """(lo, hi) of a field where both ends are finite and hi > lo, else None (an interval of width 0 says only that
    nothing was resampled, e.g. a split run at the reference's batch: no uncertainty was measured)."""
    lo, hi = num(row.get(key + "_lo")), num(row.get(key + "_hi"))
    return (lo, hi) if lo is not None and hi is not None and hi > lo else None


def with_interval(row: Mapping[str, Any], key: str, spec: str = "") -> str:
    """'0.816 (0.759..0.892)' as `rlsim run` prints it; the value alone where there is no (non-empty) interval."""
    v = fmt(row.get(key), spec)
    iv = interval(row, key) if key in RANGED else None
    if iv:
        v += f" ({fmt(iv[0], spec)}..{fmt(iv[1], spec)})"
    return v


def items(v: Any, known: Sequence[str] = ()) -> list[str]:
    """Warnings or notes as a list: a list as it is, a '; '-joined string split, nothing for None / '' / NaN.
    The `known` strings (the study's, which may hold '; ' themselves) are taken out whole before the split."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return []
    if isinstance(v, (list, tuple)):
        return [str(x).strip() for x in v if str(x).strip()]
    s, found = str(v), []
    for k in sorted(known, key=len, reverse=True):
        if k and k in s:
            found.append(k)
            s = s.replace(k, "")
    return [k for k in known if k in found] + _split(s)


def _split(s: str) -> list[str]:
    """'; '-joined items, split where no bracket is open ('(flat up to 4; AReaL ...)' stays one item)."""
    out: list[str] = []
    depth = 0
    for part in s.split("; "):
        if out and depth > 0:
            out[-1] += "; " + part
        else:
            out.append(part)
        depth = max(out[-1].count("(") + out[-1].count("[") - out[-1].count(")") - out[-1].count("]"), 0)
    return [x.strip() for x in out if x.strip()]


def own(row: Mapping[str, Any], key: str, meta: Mapping[str, Any] | None = None) -> list[str]:
    """A row's warnings (key 'warnings') or notes ('notes') less the study's own (meta[key]), which every row
    repeats."""
    study = items((meta or {}).get(key))
    return [x for x in items(row.get(key), study) if x not in study]


def unique(xs: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(x for x in xs if x))


def short_regime(v: Any) -> Any:
    return regime_key(v) or v


def varying(rows: Sequence[Mapping[str, Any]], axes: Sequence[str]) -> list[str]:
    """The axes that take more than one value over the rows (the first axis when none does)."""
    return [a for a in axes if len({repr(r.get(a)) for r in rows}) > 1] or list(axes)[:1]


def describe(row: Mapping[str, Any], axes: Sequence[str], labels: Mapping[str, str] | None = None) -> str:
    """'--prompts 64 --group 8': a config by the options that were swept."""
    labels = labels or {}
    def shown(v: Any) -> Any:
        return f"{v:g}" if isinstance(v, float) else v  # 1.0 as typed: 1

    return " ".join(f"{labels.get(a, a)} {shown(row.get(a))}" for a in axes) or f"B={row.get('responses_per_update')}"


def sweep_verdict(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any] | None = None, *,
                  describe_row: Callable[[Mapping[str, Any]], str] | None = None) -> dict[str, Any]:
    """What a ranking may honestly claim about its best config (rows ranked best first).

    `kind`: `clear` (the best's T interval lies off 1, or within the 5% band of `flat`, and no other config's
    interval reaches it; the title says "Best" only when time falls), `tied` (other configs' T intervals overlap
    the best's; without intervals, T ratios within 5%), `undecided` (the best's T interval spans 1: it may not
    beat the reference; it can also be tied), `none` (no config has a time to target). `title` and `text` say it
    in words; `tied` lists the rows the best is not told apart from; `warnings` are the study's (and a missing
    interval's), `config_warnings` those rows' own, grouped by config (`config_warnings`); `notes` are the study's
    and those rows', each once."""
    meta = meta or {}
    name = describe_row or (lambda r: describe(r, [k for k in ("prompts", "group", "lr_rule") if k in r]))
    out: dict[str, Any] = {"kind": "none", "best": rows[0] if rows else None, "tied": [], "title": "", "text": "",
                           "warnings": unique(items(meta.get("warnings"))), "config_warnings": [],
                           "notes": unique(items(meta.get("notes")))}
    timed = [r for r in rows if num(r.get("time_to_target_ratio")) is not None]
    ranked = [r for r in timed if r.get("fits") is not False]  # a config that does not fit is never the verdict
    if not ranked:
        out.update(title="No verdict", text="no config fits in memory (the warnings say what would)" if timed else
                   "no config has a predicted time to target")
        return out
    best = ranked[0]
    t = num(best["time_to_target_ratio"])
    iv = interval(best, "time_to_target_ratio")
    lo_b, hi_b = iv or (t, t)
    tied = []
    for r in ranked[1:]:
        tr = num(r["time_to_target_ratio"])
        r_iv = interval(r, "time_to_target_ratio")
        if iv is None and r_iv is None:
            close = tr <= t * (1 + REGIME_BAND)
        else:
            close = (r_iv or (tr, tr))[0] <= hi_b
        if close:
            tied.append(r)
    regime = str(best.get("regime") or "")
    spans_one = iv is not None and lo_b < 1 < hi_b
    within_band = 1 - REGIME_BAND <= lo_b and hi_b <= 1 + REGIME_BAND  # flat at this confidence, as `rlsim run` says
    undecided = regime == "undecided" or (spans_one and not within_band)

    def tv(r):
        return with_interval(r, "time_to_target_ratio", ".3f")

    out.update(best=best, tied=tied)
    if undecided:
        out["kind"] = "undecided"
        out["title"] = f"Undecided: {name(best)} may not beat the reference"
        out["text"] = (f"it has the smallest predicted T / T_ref, {tv(best)}, but "
                       + ("its interval spans 1" if spans_one else "its regime is undecided")
                       + ": whether time to target falls or rises against the reference is undecided at this "
                         "confidence")
        if tied:
            out["text"] += f"; {_names(tied, name)} {'is' if len(tied) == 1 else 'are'} not told apart from it either"
    elif tied:
        out["kind"] = "tied"
        group = [best] + tied
        out["title"] = f"Undecided between {_names(group, name)}"
        vals = ", ".join(tv(r) for r in group[:3]) + (", ..." if len(group) > 3 else "")
        why = ("the intervals overlap" if any(interval(r, "time_to_target_ratio") for r in group) else
               f"they lie within {REGIME_BAND:.0%} of each other and have no intervals")
        out["text"] = f"T / T_ref {vals}: {why}, so which is fastest is undecided at this confidence"
        regimes = {str(r.get("regime")) for r in group}
        if regimes == {"time falls"} and all((interval(r, "time_to_target_ratio") or (1, 1))[1] < 1 for r in group):
            out["text"] += (f"; {'both' if len(group) == 2 else 'all'} reach the target sooner than the reference "
                            "(time falls)")
    else:
        out["kind"] = "clear"
        out["title"] = (f"Best of {len(rows)} configs: {name(best)}" if regime == "time falls" else
                        f"No config beats the reference by more than {REGIME_BAND:.0%}; the best is {name(best)}"
                        if regime == "flat" else
                        f"No config beats the reference; the best is the reference itself, {name(best)}"
                        if regime == "reference" else f"No config beats the reference; the closest is {name(best)}")
        runner = ranked[1] if len(ranked) > 1 else None
        out["text"] = f"T / T_ref = {tv(best)}, {regime or 'regime unknown'}"
        if runner is not None:
            out["text"] += (f"; ahead of the runner-up {name(runner)} at {tv(runner)}"
                            + (", their intervals do not overlap" if iv is not None else ""))
    if iv is None and not (t == 1.0 and num(best.get("time_to_target_ratio_lo")) == 1.0):  # not the reference itself
        out["warnings"].append(NO_INTERVAL)
    out["config_warnings"] = config_warnings([best] + tied, meta, name)
    for r in [best] + tied:
        out["notes"] += [n for n in own(r, "notes", meta) if n not in out["notes"]]
    method = next((r.get("interval") for r in [best] + ranked if r.get("interval")), None)
    if method:
        out["notes"].append(f"intervals: {method}")
    return out


def config_warnings(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any] | None,
                    name: Callable[[Mapping[str, Any]], str]) -> list[dict[str, list[str]]]:
    """The rows' own warnings (beyond the study's), each said once with the configs it applies to, and the
    warnings of the same configs together: [{"configs": ["--prompts 64", ...], "warnings": [text, ...]}], in the
    rows' order."""
    applies: dict[str, list[str]] = {}
    for r in rows:
        for w in own(r, "warnings", meta):
            names = applies.setdefault(w, [])
            if name(r) not in names:
                names.append(name(r))
    groups: dict[tuple[str, ...], list[str]] = {}
    for w, names in applies.items():
        groups.setdefault(tuple(names), []).append(w)
    return [{"configs": list(k), "warnings": ws} for k, ws in groups.items()]


def config_warning_items(v: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A verdict's config warnings as (the configs, in words, the warnings):
    ('--prompts 64 and --prompts 32', 'a; b')."""
    return [(_names(g["configs"], str, most=len(g["configs"])), "; ".join(g["warnings"]))
            for g in v.get("config_warnings", ())]


def _names(rows: Sequence[Mapping[str, Any]], name: Callable, most: int = 4) -> str:
    ns = [name(r) for r in rows]
    if len(ns) > most:
        ns = ns[:most - 1] + [f"{len(ns) - most + 1} more"]
    return ", ".join(ns[:-1]) + " and " + ns[-1] if len(ns) > 1 else ns[0]


def ranking_table(rows: Sequence[Mapping[str, Any]], axes: Sequence[str], *, top: int = 10,
                  labels: Mapping[str, str] | None = None, meta: Mapping[str, Any] | None = None,
                  width: int | None = None):
    """A rich table of the best `top` rows (rows already ranked): the axes that vary, then the key results,
    each with its interval under it where there is one; a row with warnings of its own (beyond the study's,
    meta['warnings']) is marked `!`. Too wide for `width` columns, it leaves out, in turn, responses/s (sigma
    carries it), B, then the sigma and rho intervals; never the T ratio's."""
    drops = [(), ("responses_per_s",), ("responses_per_s", "responses_per_update"),
             ("responses_per_s", "responses_per_update", "sigma_iv", "rho_iv")]
    for drop in drops:
        t = _ranking_table(rows, axes, top=top, labels=labels or {}, meta=meta, drop=drop)
        if width is None:
            return t
        con = Console(width=10_000)
        if Measurement.get(con, con.options, t).maximum <= width:
            break
    return t


def _ranking_table(rows, axes, *, top, labels, meta, drop):
    swept = varying(rows, axes)
    t = Table(title=f"Ranking by time to target, best {min(top, len(rows))} of {len(rows)} (all in results.csv); "
                    "intervals under the values",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0, 0, 1))
    t.add_column("#", justify="left", no_wrap=True)  # the rank, then `!` where the config has warnings of its own
    for a in swept:
        t.add_column(labels.get(a, a).lstrip("-"), justify="right", no_wrap=True)
    cols = [c for c in TERMINAL_COLUMNS if shown_column(rows, c[0]) and c[0] not in drop]
    for _, label, _ in cols:
        t.add_column(label, justify="right", no_wrap=True)
    for r in rows[:top]:
        cells = []
        for k, _, f in cols:
            if k == "regime":
                reg = short_regime(r.get(k))
                cells.append(f"[bold yellow]{reg}[/]" if reg == "undecided" else fmt(reg))
            elif k == "fits":
                cells.append("[bold red]no[/]" if r.get(k) is False else fits_text(r.get(k)))
            elif k in RANGED and k + "_iv" not in drop and (iv := interval(r, k)):
                g = SHORT_SPEC.get(f, f)
                cells.append(f"{fmt(r.get(k), f)}\n[dim]{fmt(iv[0], g)}..{fmt(iv[1], g)}[/]")
            else:
                cells.append(fmt(r.get(k), f))
        mark = "[bold yellow]![/]" if own(r, "warnings", meta) else ""
        t.add_row(f"{r.get('rank', '')}{mark}", *[fmt(r.get(a)) for a in swept], *cells)
    t.caption = legend(rows[:top], meta)
    t.caption_justify = "left"
    return t


def legend(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any] | None = None) -> str | None:
    """What the ranking's marks mean, those it shows: `!` after a rank, the `reference` and `undecided` regimes."""
    out = []
    if any(own(r, "warnings", meta) for r in rows):
        out.append("! after the rank: the config has warnings of its own (under the verdict for the configs it names; "
                   "all in column `warnings` of results.csv)")
    if any(r.get("fits") is False for r in rows):
        out.append(NOT_FITTING)
    regimes = {short_regime(r.get("regime")) for r in rows}
    if "reference" in regimes:
        out.append("reference: the trace's own config (T / T_ref = 1)")
    if "undecided" in regimes:
        out.append("undecided: the T ratio's interval spans 1")
    return "\n".join(out) or None


def plan_lines(meta: Mapping[str, Any]) -> list[str]:
    """What `rlsim plan` says about the swept sizes (sweep metadata `plan`), as lines: the decision, or the next pilot
    with its command; nothing when the sweep had no plan."""
    p = meta.get("plan")
    if not p:
        return []
    if "error" in p:
        return [f"plan: not made ({p['error']})"]
    if p.get("no_move"):
        return ["plan: no move: the reference's cost fits cannot be used (see the warning for the recording that "
                "fixes it)"]
    if "decision" in p:
        d = p["decision"]
        what = "keep the reference" if d.get("keep_reference") else f"run P={d['prompts']}, G={d['group']}"
        sure = "" if d["p_within_5pct"] >= 0.8 else " (not a confident decision: rlsim plan says why)"
        return [f"plan: {what}: within 5 % of the best with probability {d['p_within_5pct']:.2f}, expected regret "
                f"{d['expected_regret']:.1%}{sure}"]
    x = p["pilots"][0]
    if x.get("again"):
        return [f"plan: the reference again with another seed first ({x['steps']} updates; it reads the reference "
                f"run's own luck): {x['command']}"]
    return [f"plan: a pilot first, P={x['prompts']} ({x['steps']} updates) lowers the expected regret from "
            f"{p['expected_regret']:.1%} to {x['expected_regret_after']:.1%}: {x['command']}"]
