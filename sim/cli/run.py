"""`rlsim run`, `rlsim replay`, `rlsim rank`: parse options, call one library function, print."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from rlsim.core.config import WhatIf, help_text
from rlsim.whatif.fidelity import replay_trace
from rlsim.whatif.memory import memory_line
from rlsim.cli.options import StudyOptions, command, console, read_calibrations, read_traces
from rlsim.sweeps.rank import rank_file
from rlsim.replay.errors import cli_errors
from rlsim.replay.io import read_trace
from rlsim.replay.probe import refuse_probe
from rlsim.replay.util import cores, dumps, fmt
from rlsim.whatif.predict import run


def _print_run(res) -> None:
    ref, cand = res.reference, res.candidate
    moved = cand.hardware != "as recorded"
    t = Table(title=f"rlsim run: reference vs P={cand.prompts}, G={cand.group} (lr {cand.lr_rule})"
                    + (f", both on {cand.hardware}" if moved else ""))
    t.add_column("")
    t.add_column("reference (same hardware)" if moved else "reference (trace)", justify="right")
    t.add_column("candidate", justify="right")
    rows = [("prompts P", "prompts", ""), ("group G", "group", ""), ("responses B = P x G", "responses_per_update", ""),
            ("lr rule", "lr_rule", ""), ("responses/s", "responses_per_s", ""), ("step time", "step_time_s", "s"),
            ("  generation", "gen_s", "s"), ("  training", "train_s", "s"), ("  sync", "sync_s", "s"),
            ("  idle (rewards, other)", "idle_s", "s"), ("engine steps / round", "gen_steps", ""),
            ("sigma (throughput gain)", "sigma", "x"), ("rho (sample cost)", "rho", "x"),
            ("T / T_ref = rho / sigma", "time_to_target_ratio", "x"), ("time to target", "time_to_target_s", "s"),
            ("regime", "regime", "")]
    if cand.mode != "colocated":  # split devices (rlsim.modes.split)
        rows[1:1] = [("devices", "mode", "")]
        rows = [("  waiting for generation", k, u) if k == "gen_s" else (lab, k, u) for lab, k, u in rows]
        rows[-1:-1] = [("generator idle", "gen_idle_ratio", "%"), ("trainer idle", "train_idle_ratio", "%"),
                       ("staleness mean / max", "staleness", ""), ("rho factor of staleness", "rho_staleness", "x"),
                       ("all-reduce / update", "allreduce_s", "s")]
    ranged = ("responses_per_s", "sigma", "rho", "time_to_target_ratio")

    def cell(o, key, kind):
        if key == "staleness":
            return f"{fmt(o.staleness_mean, '.3g')} / {o.staleness_max}"
        v = fmt(getattr(o, key), kind)
        lo, hi = getattr(o, key + "_lo", math.nan), getattr(o, key + "_hi", math.nan)
        if key in ranged and math.isfinite(lo) and math.isfinite(hi) and hi > lo:
            v += f" ({fmt(lo, kind)}..{fmt(hi, kind)})"
        return v

    for label, key, kind in rows:
        t.add_row(label, cell(ref, key, kind), cell(cand, key, kind))
    con = console()
    if res.mode_line:
        con.print(res.mode_line, markup=False)
    con.print(t)
    if cand.interval:
        con.print(f"intervals: {cand.interval}")
    val = res.validation
    if val is not None:
        for line in val.summary():
            con.print(f"fit: {line}")
        for note in val.notes:
            con.print(f"fit: {note}")
    if math.isfinite(res.recorded_step_time_s):
        con.print(f"recorded (median of the trace's updates): {res.recorded_responses_per_s:.4g} responses/s, "
                  f"step time {res.recorded_step_time_s:.4g} s")
    extra = f" (B_crit = {res.b_crit:.4g} responses)" if res.rho_model == "noise-scale" else ""
    con.print(f"rho model: {res.rho_model}{extra}")
    if math.isfinite(res.b_crit_critic):
        con.print(f"gradient noise scale: actor B_crit = {res.b_crit:.4g}, critic B_crit = {res.b_crit_critic:.4g} "
                  "responses (rho uses the actor's)")
    if math.isfinite(res.target):
        n = f"{res.n_star_ref:.4g} responses" if math.isfinite(res.n_star_ref) else "never"
        rec = (f", recorded wall time {res.recorded_time_to_target_s:.4g} s incl. evals"
               if math.isfinite(res.recorded_time_to_target_s) else "")
        con.print(f"target: eval score {res.target:.4g}; reference reached it after {n}{rec}")
    if moved and cand.hardware_gain != 1.0:  # (a split on the recorded devices: the same hardware, nothing to add)
        con.print(f"hardware: {cand.hardware}; there the reference configuration runs {cand.hardware_gain:.3g}x its "
                  "recorded responses/s. T vs the reference as recorded (batch and hardware together): "
                  f"{fmt(cand.time_to_target_vs_recorded, 'x')}")
    memory = _memory_lines(ref, cand)
    for line in memory:
        con.print(f"memory: {line}")
    con.print(f"verdict: {_verdict(cand)}")
    for w in list(res.warnings) + list(cand.warnings):
        con.print(f"[yellow]warning:[/yellow] {w}")
    for n in list(res.notes) + list(cand.notes):
        if n.split(": ", 1)[-1] not in " ".join(memory):  # the memory line says it already
            con.print(f"[dim]note: {n}[/dim]")


def _memory_lines(ref, cand) -> list[str]:
    """The candidate's memory per device; the reference's too where it differs (another batch, same devices)."""
    c, r = memory_line(cand.memory), memory_line(ref.memory)
    return [c] if r == c or ref.memory is None else [f"candidate {c}", f"reference {r}"]


def _verdict(o) -> str:
    """One line: the regime and the T / T_ref interval it rests on."""
    lo, hi = o.time_to_target_ratio_lo, o.time_to_target_ratio_hi
    iv = f" (90% interval {fmt(lo, 'x')}..{fmt(hi, 'x')})" if math.isfinite(lo) and math.isfinite(hi) and hi > lo else \
        " (no interval: point estimate)"
    oom = "; does not fit in memory (see the warning)" if o.fits is False else ""
    return f"{o.regime}: T / T_ref = {fmt(o.time_to_target_ratio, 'x')}{iv}{oom}"


def register(app: typer.Typer) -> None:
    @command(app, "run",
             help="Predict throughput, sample cost and time-to-target of a batch size from a recorded trace.")
    def run_cmd(fields: dict, so: StudyOptions,
                as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table")) -> None:
        cfg = WhatIf(**fields)  # validated by `run`, in the mode the trace records where no --mode is given
        res = run(read_traces(so), cfg, rho_model=so.rho_model, target=so.target, calibration=read_calibrations(so),
                  workers=cores())
        if as_json:
            typer.echo(dumps(res.to_dict(), indent=2))
        else:
            _print_run(res)

    @app.command("replay")
    @cli_errors
    def replay_cmd(
        trace: Path = typer.Argument(..., help="recorded trace to replay"),
        seed: int = typer.Option(0, "--seed", help=help_text(WhatIf)["seed"]),
        drop_invalid: bool = typer.Option(False, "--drop-invalid", help=help_text(StudyOptions)["drop_invalid"]),
        sampled: bool = typer.Option(False, "--sampled", help="draw response lengths from the fitted distribution "
                                                              "instead of replaying the recorded ones"),
        per_update: bool = typer.Option(False, "--per-update", help="also print every update"),
        as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    ) -> None:
        """Simulate exactly the recorded configuration; print recorded vs simulated times and errors."""
        res = replay_trace(refuse_probe(read_trace(trace, drop_invalid=drop_invalid)), seed=seed,
                           lengths="sampled" if sampled else "recorded")
        if as_json:
            typer.echo(dumps(res.to_dict(), indent=2))
            return

        con = console()
        errs = res.errors()
        t = Table(caption="per-update relative errors; recorded/simulated: means over the updates",
                  title=f"rlsim replay {res.trace}: {len(res.step)} updates"
                        f"{' (step 0, the warm-up, left out)' if res.skipped_warmup else ''}, {res.lengths} lengths")
        for c in ("metric", "recorded", "simulated", "mean err", "median err", "max err"):
            t.add_column(c, justify="right" if c != "metric" else "left")
        units = {"step_time": "s", "gen_time": "s", "responses_per_s": ""}
        labels = {"step_time": "step time", "gen_time": "gen time", "responses_per_s": "responses/s"}
        for k, e in errs.items():
            t.add_row(labels[k], fmt(e["recorded_mean"], units[k]), fmt(e["simulated_mean"], units[k]),
                      f"{100 * e['mean_error']:.2f}%", f"{100 * e['median']:.2f}%", f"{100 * e['max']:.2f}%")
        con.print(t)
        if per_update:
            pu = Table(title="per update")
            for c in ("step", "rec step", "sim step", "rec gen", "sim gen", "rec resp/s", "sim resp/s"):
                pu.add_column(c, justify="right")
            for i, s in enumerate(res.step):
                pu.add_row(str(int(s)), *(fmt(float(d[k][i])) for k in ("step_time", "gen_time", "responses_per_s")
                                          for d in (res.recorded, res.simulated)))
            con.print(pu)
        for w in res.warnings:
            con.print(f"[yellow]warning:[/yellow] {w}")

    @app.command("rank")
    @cli_errors
    def rank_cmd(
        measurements: Path = typer.Option(..., "--measurements", "-m",
                                          help="CSV: config,sigma,rho or config,responses_per_s,samples_to_target"),
        reference: Optional[str] = typer.Option(
            None, "--reference", "-r",
            help="config name of the reference row (leave it out when sigma and rho are already relative to it)"),
        as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    ) -> None:
        """Rank configurations by time-to-target ratio rho / sigma from your own measurements."""
        ranked, present = rank_file(measurements, reference)
        best = ranked[0]
        if as_json:
            typer.echo(dumps({"reference": reference, "best": best.config, "rows": [r.to_dict() for r in ranked]},
                             indent=2))
            return

        t = Table(title=f"rlsim rank (reference {reference})" if present else "rlsim rank (sigma and rho as given)")
        for c in ("config", "sigma", "rho", "T / T_ref", "regime"):
            t.add_column(c, justify="left" if c in ("config", "regime") else "right")
        for r in ranked:
            t.add_row(r.config, f"{r.sigma:.3f}", f"{r.rho:.3f}", f"{r.time_to_target_ratio:.3f}", r.regime)
        con = console()
        con.print(t)
        if not present:
            con.print("note: no --reference; sigma and rho are taken as already relative to the reference")
        con.print(f"best: {best.config} (T / T_ref = {best.time_to_target_ratio:.3f}, {best.regime})")
