"""Published GPU runs as a reality check: import one row of each group, predict the others.

    python -m bench.published [--group ID] [--only verl|nemo_rl|areal] [--json docs/study/published.json]
                              [--fit 0,0.003,0.006,0.012] [--fit-gain 1,1.5,2] [--workers N]

The rows are in bench/published/*.toml, each transcribed from a framework's docs or a paper with its
source (repository, path and commit, or paper and table), model, hardware and the configuration that
differs between rows. For each group the first row is the reference: it becomes a verl console log (the
table's mean phase times on every step line) and its Hydra config, imported by `rlsim import verl` with the
group's device; every other row is a what-if on that trace (more GPUs, a split with its staleness, another
device) whose predicted step time is compared with the published one.

What the tables do not print is assumed, the same for every group (`ASSUMED`): the response lengths (mean a
quarter of the cap, the longest at the cap) and prompt lengths. Those assumptions and the split of
generation into per-step and per-token cost are what a phase-level log cannot identify; rlsim's interval
spans the second, the table states the first, and each row names the terms its interval spans when it is
wider than 2x. `--fit` and `--fit-gain` set the constants no log identifies, the engine's per-step overhead
(rlsim.replay.fit_steps.ENGINE_STEP_OVERHEAD_S) and a split side's speed per device over a colocated log's
(rlsim.whatif.study.SPLIT_SHARING_GAIN), leave-one-source-out over their grid: verl's rows choose them for NeMo RL's
and AReaL's and the other way round, so every row is scored out of sample (docs/results.md sections 14, 20).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlsim.core.config import WhatIf
from rlsim.replay.devices import get_profile
from rlsim.replay.errors import RlsimError
from rlsim.replay.importers import import_log
from rlsim.replay.io import read_trace
from rlsim.whatif.predict import evaluate
from rlsim.whatif.study import prepare

ROWS = Path(__file__).resolve().parent / "published"
STEPS = 8                 # step lines per synthesized log (identical: the table prints means); the fit drops the first
UPDATES = 20              # simulated updates per prediction (the first of a split fills its pipeline)
# what no published table prints, assumed alike for every group (fractions of the group's caps)
ASSUMED = {"response_mean": 0.25, "response_min_tokens": 32, "response_clip_ratio": 0.02,
           "prompt_mean": 0.1, "prompt_max": 0.5, "prompt_cap_tokens": 1024}
PHASES = ("gen", "old_log_prob", "ref", "values", "update_critic", "update_actor", "update_weights")


@dataclass(frozen=True)
class Row:
    """One published configuration and its measured times (seconds per step)."""

    label: str = field(metadata={"help": "the row as the source names it"})
    mode: str = field(metadata={"help": "colocate | one_step_off | fully_async"})
    gpus: int = field(metadata={"help": "GPUs in all"})
    step: float = field(metadata={"help": "published seconds per step"})
    phases: dict[str, float] = field(metadata={"help": "published per-phase seconds, by the source's names"})
    gen_gpus: int | None = field(default=None, metadata={"help": "generation GPUs of a split"})
    train_gpus: int | None = field(default=None, metadata={"help": "training GPUs of a split"})
    staleness: float | None = field(default=None, metadata={
        "help": "the source's staleness setting (verl: a fraction of a batch)"})
    partial_rollout: bool = field(default=False, metadata={"help": "responses continue across a weight update"})
    device: str | None = field(default=None, metadata={"help": "GPU type when it differs from the group's"})
    tp: int | None = field(default=None, metadata={"help": "generation tensor parallel size, where the row states it"})
    mean_response: float | None = field(default=None, metadata={"help": "published mean generated length, tokens"})
    precision: str = field(default="bf16", metadata={"help": "bf16 | fp8"})
    weight_sync: str | None = field(default=None, metadata={
        "help": "the split's weight-sync path (rlsim.replay.rollout_costs)"})
    rollout_log_probs: bool = field(default=False, metadata={
        "help": "the trainer takes old log-probs from the rollout (verl fully_async's use_rollout_log_probs)"})


@dataclass(frozen=True)
class Group:
    """Rows of one model and setup from one source; the first is the reference."""

    id: str = field(metadata={"help": "unique name"})
    meta: dict[str, Any] = field(metadata={
        "help": "the TOML group's fields (source, model, params, device, batch, caps)"})
    rows: tuple[Row, ...] = field(metadata={"help": "the published rows, reference first"})


def _toml(text: str) -> dict[str, Any]:
    if sys.version_info < (3, 11):
        raise SystemExit("bench.published reads its rows with tomllib: run it on Python 3.11 or newer")
    import tomllib  # stdlib from 3.11 (the package itself supports 3.10)
    return tomllib.loads(text)


def _groups(path: Path) -> list[dict[str, Any]]:
    """The `[[group]]` tables of one rows file, each with its rows checked for the fields every row needs."""
    try:
        groups = _toml(path.read_text())["group"]
        for g in groups:
            for r in g["row"]:
                missing = [k for k in ("label", "gpus", "step") if k not in r]
                if missing:
                    raise ValueError(f"group {g.get('id')!r} has a row without {', '.join(missing)}")
        return groups
    except (ValueError, KeyError, TypeError) as e:  # tomllib.TOMLDecodeError is a ValueError
        raise SystemExit(f"bench.published: {path} is not a rows file ({type(e).__name__}: {e}); "
                         "see bench/published/verl.toml")


def load_groups(folder: Path = ROWS) -> list[Group]:
    """Every group of every TOML file under `folder`, reference (its first colocated row) first. Groups of one
    setup on other GPU types (the same `setup_key`) join the first such group as rows on their device."""
    out: list[Group] = []
    by_key: dict[str, int] = {}
    for path in sorted(folder.glob("*.toml")):
        for g in _groups(path):
            rows = [_row(r, g.get("device"), g.get("weight_sync")) for r in g.pop("row")]
            g["file"] = path.name
            key = g.get("setup_key")
            if key in by_key:
                first = out[by_key[key]]
                out[by_key[key]] = Group(first.id, first.meta, first.rows + tuple(rows))
                continue
            rows.sort(key=lambda r: r.mode not in ("colocate", "sync"))  # stable: the first colocated row leads
            if key:
                by_key[key] = len(out)
            out.append(Group(g["id"], g, tuple(rows)))
    return out


def _row(r: dict[str, Any], device: str | None, sync: str | None = None) -> Row:
    phases = {k: float(v) for k, v in r.items() if k in PHASES}
    st = r.get("staleness_threshold", r.get("staleness"))
    return Row(label=r["label"], mode=r.get("mode", "colocate"), gpus=int(r["gpus"]), step=float(r["step"]),
               phases=phases,
               gen_gpus=r.get("gen_gpus"), train_gpus=r.get("train_gpus"), staleness=None if st is None else float(st),
               partial_rollout=bool(r.get("partial_rollout", False)), device=r.get("device", device),
               tp=r.get("tp", r.get("gen_tp")), mean_response=r.get("gen_avg_seq_len"),
               precision=r.get("precision", "bf16"),
               weight_sync=r.get("weight_sync", sync), rollout_log_probs=bool(r.get("use_rollout_log_probs", False)))


def _caps(g: Group) -> tuple[int, int]:
    """(max response, max prompt) tokens: the group's, else its maximum sequence length less an assumed prompt cap."""
    m = g.meta
    if "max_response" in m:
        return int(m["max_response"]), int(m.get("max_prompt", ASSUMED["prompt_cap_tokens"]))
    pcap = min(int(ASSUMED["prompt_cap_tokens"]), int(m["max_seq_len"]) // 4)
    return int(m["max_seq_len"]) - pcap, pcap


def known_device(name: str | None) -> str | None:
    """`name` when rlsim has its profile, else None (the import then records the device by name only)."""
    try:
        return get_profile(name).key if name else None
    except RlsimError:
        return None


def unusable(g: Group) -> str:
    """Why a group cannot be imported as a log ('' when it can): the source leaves its batch or length cap unstated."""
    missing = [k for k in ("prompts", "group") if not g.meta.get(k)]
    if not (g.meta.get("max_response") or g.meta.get("max_seq_len")):
        missing.append("max_response")
    return f"the source does not state {', '.join(missing)}" if missing else ""


def verl_log(g: Group, r: Row) -> tuple[str, str]:
    """(console log, Hydra config) of the reference row as verl would print and save them."""
    m = g.meta
    cap, pcap = _caps(g)
    stats = {"response_length/mean": r.mean_response or ASSUMED["response_mean"] * cap, "response_length/max": cap,
             "response_length/min": ASSUMED["response_min_tokens"],
             "response_length/clip_ratio": ASSUMED["response_clip_ratio"],
             "prompt_length/mean": ASSUMED["prompt_mean"] * pcap, "prompt_length/max": ASSUMED["prompt_max"] * pcap,
             "prompt_length/min": 16, "actor/lr": 1e-6, "critic/score/mean": 0.5}
    phases = dict(r.phases)
    lines = []
    for s in range(1, STEPS + 1):
        fields = [f"step:{s}"] + [f"timing_s/{k}:{v!r}" for k, v in phases.items()] + [f"timing_s/step:{r.step!r}"]
        fields += [f"{k}:{v!r}" for k, v in stats.items()]
        lines.append("(TaskRunner pid=1) " + " - ".join(fields))
    nodes, per_node = (r.gpus // 8, 8) if r.gpus % 8 == 0 else (1, r.gpus)
    # AReaL's PPO configs disable the critic (ppo.disable_value) and normalise in the group: GRPO's advantages
    algo = "gae" if m.get("algo") == "ppo" and int(m.get("group", 1)) == 1 else "grpo"
    config = (f"data:\n  train_batch_size: {m['prompts']}\n  max_prompt_length: {pcap}\n  max_response_length: {cap}\n"
              f"actor_rollout_ref:\n  model:\n    path: {json.dumps(m['model'])}\n  rollout:\n    n: {m['group']}\n"
              f"    tensor_model_parallel_size: {r.tp or m.get('tp', 1)}\n  actor:\n    optim:\n      lr: 1.0e-06\n"
              f"algorithm:\n  adv_estimator: {algo}\ntrainer:\n  n_gpus_per_node: {per_node}\n  nnodes: {nodes}\n")
    return "\n".join(lines) + "\n", config


def what_if(g: Group, ref: Row, r: Row) -> WhatIf:
    """The rlsim what-if of row `r` on the reference's trace, in the framework's execution mode
    (rlsim.modes.registry) with its settings as the rows file prints them."""
    device = known_device(r.device) if r.device != ref.device else None
    if r.mode in ("colocate", "sync") or _same_split(ref, r):  # the reference's own layout, more or fewer devices
        return WhatIf(gpus=r.gpus, device=device, updates=UPDATES)
    common = dict(gen_gpus=r.gen_gpus, train_gpus=r.train_gpus, device=device, updates=UPDATES,
                  gen_tp=r.tp or g.meta.get("tp"), weight_sync=r.weight_sync, rollout_log_probs=r.rollout_log_probs)
    if g.meta["file"] == "nemo_rl.toml":  # NeMo RL async GRPO: max_trajectory_age_steps, in-flight weight updates
        return WhatIf(mode="nemo_async", max_trajectory_age_steps=int(r.staleness or 1),
                      in_flight_weight_updates=r.partial_rollout, **common)
    if r.mode == "fully_async":  # verl: the trainer streams trigger_parameter_sync_step fetches per weight sync
        return WhatIf(mode="fully_async", staleness_threshold=r.staleness or 0.0, partial_rollout=r.partial_rollout,
                      trigger_parameter_sync_step=int(g.meta.get("trigger_parameter_sync_step", 1)),
                      require_batches=int(g.meta.get("require_batches", 1)), **common)
    if r.mode == "one_step_off":
        return WhatIf(mode="one_step_off", **common)
    return WhatIf(staleness=0, partial_rollout=r.partial_rollout, **common)  # AReaL v0.2: synchronous on split GPUs


def _same_split(ref: Row, r: Row) -> bool:
    """Both rows split alike (same mode and staleness, generation : training in the same proportion): the imported
    log already holds that layout's phase times, so only the device count changes."""
    return (r.mode == ref.mode and r.mode != "colocate" and r.staleness == ref.staleness and bool(r.gen_gpus)
            and bool(ref.gen_gpus) and r.gen_gpus * ref.train_gpus == ref.gen_gpus * r.train_gpus)


def changes(ref: Row, r: Row) -> str:
    """What differs from the reference, in words."""
    out = []
    stale = "" if r.staleness is None else f", staleness {r.staleness:g}" + (" +partial" if r.partial_rollout else "")
    if r.mode != ref.mode:
        out.append(r.mode.replace("_", "-") + (f" {r.gen_gpus}:{r.train_gpus}" if r.gen_gpus else "") + stale)
    elif r.gen_gpus and (r.gen_gpus, r.train_gpus, r.staleness) != (ref.gen_gpus, ref.train_gpus, ref.staleness):
        out.append(f"{r.gen_gpus}:{r.train_gpus}{stale}")
    if r.gpus != ref.gpus:
        out.append(f"{ref.gpus} -> {r.gpus} GPUs")
    if r.device != ref.device:
        out.append(f"{ref.device} -> {r.device}")
    return ", ".join(out) or "same"


def source_of(g: Group) -> str:
    """The group's source for leave-one-source-out fitting: verl, or the others (NeMo RL and AReaL)."""
    return "verl" if g.meta["file"] == "verl.toml" else "nemo_rl+areal"


# the interval's far ends, by the words rlsim.whatif.intervals gives them, as the term each leaves unidentified
TERMS = (("per-step generation cost", "per-step vs per-token generation cost"),
         ("generation's share", "generation's share of a whole-step log"),
         ("device-sharing costs", "the colocated log's device-sharing costs"),
         ("datasheet gain", "the new device's achieved gain"), ("roofs a term reaches", "which roof on the new device"))


def interval_terms(how: str) -> str:
    """The unidentified terms an Outcome's interval spans (its `interval` text), short names, '; '-joined."""
    return "; ".join(short for key, short in TERMS if key in (how or ""))


def import_reference(g: Group, work: Path) -> Path:
    """The group's reference row as verl's console log and config under `work`, imported by `rlsim import verl` (as
    a user would run it) with the group's device and model size: the trace's path."""
    ref = g.rows[0]
    log, config = verl_log(g, ref)
    (work / f"{g.id}.log").write_text(log)
    (work / f"{g.id}.yaml").write_text(config)
    return import_log("verl", work / f"{g.id}.log", out=work / f"{g.id}.parquet", config=str(work / f"{g.id}.yaml"),
                      device=known_device(ref.device), model_params=str(g.meta["params"]), overwrite=True)


def split_gain(g: Group, gain: float | None) -> float | None:
    """The split gain a group's prediction takes: none (1) where its reference row ran generation and training on
    disjoint GPUs (AReaL v0.2's split_sync), which its imported log, a verl log of the whole step, cannot say; else
    `gain` (None: the package's, `rlsim.whatif.study.SPLIT_SHARING_GAIN`)."""
    return gain if g.rows[0].mode in ("colocate", "sync") else 1.0


def predict_group(g: Group, work: Path, overhead: float | None = None,
                  gain: float | None = None) -> list[dict[str, Any]]:
    """Import the group's reference row, then predict every other row: one dict per row. `overhead`: the engine-step
    overhead prior (rlsim.replay.fit_steps.ENGINE_STEP_OVERHEAD_S when None); `gain`: a split side's speed per
    device over the colocated log's (`split_gain`)."""
    ref, m = g.rows[0], g.meta
    study = prepare([read_trace(import_reference(g, work))], step_overhead_s=overhead, split_gain=split_gain(g, gain))
    out = []
    for r in g.rows[1:]:
        if r.precision != ref.precision:  # rlsim has no precision what-if
            continue
        o = evaluate(study, what_if(g, ref, r))
        B = o.responses_per_update
        lo = B / o.responses_per_s_hi if o.responses_per_s_hi > 0 else math.nan
        hi = B / o.responses_per_s_lo if o.responses_per_s_lo > 0 else math.nan
        err = o.step_time_s / r.step - 1.0
        out.append({"group": g.id, "reference": ref.label, "row": r.label, "changes": changes(ref, r),
                    "published_s": r.step, "predicted_s": o.step_time_s, "lo_s": lo, "hi_s": hi, "error": err,
                    "covered": bool(lo <= r.step <= hi) if math.isfinite(lo) and math.isfinite(hi) else None,
                    "gen_s": o.gen_s, "train_s": o.train_s, "sync_s": o.sync_s, "source": m["source"],
                    "fold": source_of(g), "split": bool(r.gen_gpus) and r.mode not in ("colocate", "sync"),
                    "hi_lo": hi / lo if lo > 0 else math.nan, "terms": interval_terms(getattr(o, "interval", ""))})
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and max |error| of the step time, how often the interval held the published value, and how often it
    held it at most 2x wide; for all pairs, the split/async ones and the colocated ones."""
    def part(rs: list[dict[str, Any]]) -> dict[str, Any]:
        errs = [abs(r["error"]) for r in rs]
        cov = [r for r in rs if r["covered"] is not None]
        return {"pairs": len(rs), "median_abs_error": statistics.median(errs) if errs else math.nan,
                "max_abs_error": max(errs) if errs else math.nan, "covered": sum(bool(r["covered"]) for r in cov),
                "with_interval": len(cov),
                "covered_within_2x": sum(bool(r["covered"]) and r["hi_lo"] <= 2 for r in cov),
                "within_2x": sum(r["hi_lo"] <= 2 for r in cov)}
    out = part(rows)
    out["split"] = part([r for r in rows if r["split"]])
    out["colocated"] = part([r for r in rows if not r["split"]])
    return out


def _line(name: str, s: dict[str, Any]) -> str:
    return (f"{name}: {s['pairs']} pairs, |error| median {100 * s['median_abs_error']:.1f} %, max "
            f"{100 * s['max_abs_error']:.1f} %; interval holds {s['covered']} of {s['with_interval']} "
            f"({s['covered_within_2x']} of them with hi/lo <= 2; {s['within_2x']} intervals within 2x)")


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| group | reference -> row | what changes | published s | predicted s (interval) | error | hi/lo "
            "| in interval | in-sample | wider than 2x: unidentified |")
    out = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        iv = f" ({r['lo_s']:.0f}..{r['hi_s']:.0f})" if math.isfinite(r["lo_s"]) else ""
        yes = {True: "yes", False: "no", None: "-"}[r["covered"]]
        terms = r["terms"] if r["hi_lo"] > 2 else ""
        out.append(f"| {r['group']} | {r['reference']} -> {r['row']} | {r['changes']} | {r['published_s']:.1f} | "
                   f"{r['predicted_s']:.1f}{iv} | {100 * r['error']:+.1f} % | {r['hi_lo']:.2f} | {yes} | "
                   f"{'yes' if r.get('in_sample') else 'no'} | {terms} |")
    s = summary(rows)
    out += ["", _line("all", s), _line("split/async", s["split"]), _line("colocated", s["colocated"])]
    return "\n".join(out)


def run_all(groups: list[Group], overhead: float | None, gain: float | None = None) -> list[dict[str, Any]]:
    """Every usable group's predicted rows at the engine-step overhead `overhead` and split gain `gain`."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for g in groups:
            if not unusable(g):
                rows += predict_group(g, Path(tmp), overhead, gain)
    return rows


def leave_one_source_out(by_value: dict[Any, list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each fold's rows predicted at the fitted values (an overhead, or an (overhead, gain) pair) that gave the lowest
    median |error| on the other fold's rows (verl's rows set them for NeMo RL's and AReaL's, and the other way
    round): every row out of sample."""
    folds = sorted({r["fold"] for rows in by_value.values() for r in rows})
    chosen: dict[str, float] = {}
    out: list[dict[str, Any]] = []
    for f in folds:
        def score(v: float) -> float:
            errs = [abs(r["error"]) for r in by_value[v] if r["fold"] != f]
            return statistics.median(errs) if errs else math.inf
        chosen[f] = min(by_value, key=score)
        out += [dict(r, in_sample=False, fitted=chosen[f]) for r in by_value[chosen[f]] if r["fold"] == f]
    return out, chosen


def _fitted(v: tuple[float | None, float | None]) -> str:
    """An (overhead, gain) pair as the table and the JSON name it; None: the package's value."""
    o, g = v
    return (f"overhead {'package' if o is None else f'{o * 1e3:g} ms'}, "
            f"split gain {'package' if g is None else f'{g:g}x'}")


def _values(text: str, flag: str, least: float) -> list[float]:
    """A comma-separated list of numbers >= `least`, else one line saying what is wrong (SystemExit)."""
    try:
        out = [float(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"bench.published: {flag} takes comma-separated numbers, e.g. {flag} 1,1.5,2; got {text!r}")
    if not all(math.isfinite(v) and v >= least for v in out):
        raise SystemExit(f"bench.published: {flag} values must be finite and at least {least:g}; got {text!r}")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--group", action="append", help="only these group ids (repeatable)")
    ap.add_argument("--only", action="append", help="only the groups of this rows file, by its stem: verl | nemo_rl "
                    "| areal (repeatable)")
    ap.add_argument("--json", type=Path, help="also write the rows and the summary as JSON here")
    ap.add_argument("--fit", type=str, default=None, help="comma-separated engine-step overheads (seconds) to fit "
                    "leave-one-source-out, e.g. 0,0.004,0.008,0.016; without it, the package's ENGINE_STEP_OVERHEAD_S")
    ap.add_argument("--fit-gain", type=str, default=None, help="comma-separated split gains (a split side's speed per "
                    "device over the colocated log's) to fit leave-one-source-out with --fit's overheads, e.g. "
                    "1,1.5,2; without it, the package's SPLIT_SHARING_GAIN")
    ap.add_argument("--workers", type=int, default=1, help="processes running the --fit/--fit-gain candidates")
    args = ap.parse_args(argv)
    groups = [g for g in load_groups() if (not args.group or g.id in args.group)
              and (not args.only or Path(g.meta["file"]).stem in args.only)]
    if not groups:
        raise SystemExit("bench.published: no group matches --group/--only; the rows files are "
                         + ", ".join(p.stem for p in sorted(ROWS.glob("*.toml"))))
    skipped = [f"{g.id}: {why}" for g in groups if (why := unusable(g))]
    chosen: dict[str, Any] = {}
    by_value: dict[tuple[float | None, float | None], list[dict[str, Any]]] = {}
    if args.fit or args.fit_gain:
        overheads = _values(args.fit, "--fit", 0.0) if args.fit else [None]
        gains = _values(args.fit_gain, "--fit-gain", 1e-9) if args.fit_gain else [None]
        keys = [(o, gn) for o in overheads for gn in gains]
        with concurrent.futures.ProcessPoolExecutor(max(args.workers, 1)) as pool:
            by_value = dict(zip(keys, pool.map(run_all, [groups] * len(keys), *zip(*keys))))
        for v, rs in by_value.items():
            print(f"{_fitted(v)}: " + _line("all", summary(rs)))
        rows, chosen = leave_one_source_out(by_value)
        print("leave-one-source-out: " + ", ".join(f"{f} scored at {_fitted(v)} (fitted on the other source)"
                                                   for f, v in chosen.items()))
    else:
        rows = [dict(r, in_sample=False) for r in run_all(groups, None)]
    print(table(rows))
    for line in skipped:
        print(f"skipped {line}")
    print(f"\nassumed for every group (no table prints them): {json.dumps(ASSUMED)}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary(rows), "assumed": ASSUMED,
                                         "fitted_by_fold": {f: _fitted(v) for f, v in chosen.items()},
                                         "command": "python -m bench.published "
                                         + " ".join(argv if argv is not None else sys.argv[1:]),
                                         "rows_by_fitted": {_fitted(v): rs for v, rs in by_value.items()}},
                                        indent=1, default=str))


if __name__ == "__main__":
    main()
