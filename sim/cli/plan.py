"""`rlsim plan`: parse options, build a PlanConfig, call `rlsim.sweeps.plan.plan`, print the decision or the pilots."""
from __future__ import annotations

import math
from dataclasses import fields
from typing import Optional

import typer

from rlsim.cli.opts import default_text
from rlsim.core.config import WhatIf
from rlsim.modes.registry import GENERAL
from rlsim.cli.options import StudyOptions, command, console, labels, read_traces
from rlsim.sweeps.plan import Plan, PlanConfig, plan
from rlsim.replay.errors import RlsimError
from rlsim.replay.util import dumps, fmt


# what every candidate of a plan shares: the execution mode, its settings (rlsim.modes.registry), its devices and
# the split's hardware path
SHARED = ("mode", "gen_gpus", "train_gpus", "gen_tp", "weight_sync", "rollout_log_probs",
          *sorted(set(f.name for f in fields(WhatIf)) - GENERAL))


SOURCE = {"reference": "ref", "pilot": "pilot", "pilot prefix": "prefix", "prediction": "model"}


def _cell(x: float, noise: float) -> str:
    """A value, with its seed noise (sd in log, as a factor) where a pilot measured it."""
    return f"{x:.3f}" if not math.isfinite(noise) or noise == 0 else f"{x:.2f}x/{math.exp(noise):.2f}"


PILOTS_SHOWN = 5  # the table's list of pilots; --json has all
WIDTHS = (4, 3, 10, 10, 6, 11, 5, 5, 8, 6)  # one row in 78 columns: a terminal's 80 with room to spare


def table_lines(p: Plan) -> list[str]:
    """The candidates as fixed-width lines (header, rule, one a candidate), each within 80 columns."""
    rows = [("P", "G", "sigma", "rho", "T/Tref", "5..95 %", "p<=5%", "p<ref", "E regret", "from")]
    for c in p.candidates:
        rows.append((str(c.prompts), str(c.group), _cell(c.sigma, c.sigma_noise), _cell(c.rho, c.rho_noise),
                     f"{c.time_to_target_ratio:.3f}",
                     f"{c.time_to_target_ratio_lo:.2f}..{c.time_to_target_ratio_hi:.2f}",
                     fmt(c.p_within_5pct, ".2f"), fmt(c.p_beats_reference, ".2f"),
                     fmt(c.expected_regret, ".1%") if c.fits is not False else "no fit", SOURCE[c.source]))
    lines = [" ".join(x.rjust(w) for x, w in zip(r, WIDTHS)) for r in rows]
    return [lines[0], "-" * len(lines[0]), *lines[1:]]


def _print(p: Plan) -> None:
    con = console()
    for line in (p.mode_line, p.asked):
        if line:
            con.print(line, markup=False)
    con.print(f"rlsim plan: reference P={p.reference_prompts}; T / T_ref over the measured uncertainty")
    for line in table_lines(p):
        con.print(line, markup=False)
    con.print("[dim]p<=5%: within 5 % of the best; p<ref: beats the reference; a pilot's value x/f: its seed noise "
              "(one sd, a factor); from: ref(erence), pilot (to the target), prefix (a pilot short of it), model "
              "(predicted)[/dim]")
    if p.decision is not None:
        d = p.decision
        what = "keep the reference" if d.prompts == p.reference_prompts else f"run P={d.prompts}, G={d.group}"
        sure = "" if d.p_within_5pct >= 0.8 else "; not a confident decision: see the warning"
        con.print(f"decision: {what} (within 5 % of the best with probability {d.p_within_5pct:.2f}, expected regret "
                  f"{d.expected_regret:.1%}{sure})")
        con.print(f"why: {p.why}")
    elif p.no_move:
        con.print("no move: the reference's cost fits cannot be used, so neither a decision nor a pilot rests on them "
                  "(see the first warning for the recording that fixes it)")
    else:
        con.print(f"pilots (expected regret now {p.expected_regret:.1%}: {p.why}; the most regret removed per "
                  "response first):")
        for x in p.pilots[:PILOTS_SHOWN]:
            what = (f"a prefix, {x.responses:,} responses, set against the reference at equal responses"
                    if x.prefix else f"to the target, about {x.responses:,} responses")
            head = (f"the reference again, another seed, up to {x.steps} updates (stop it at the target, about "
                    f"{x.responses:,} responses: it reads the reference run's own luck)" if x.again
                    else f"P={x.prompts} for {x.steps} updates ({what}) -> expected regret "
                         f"{x.expected_regret_after:.1%}")
            con.print(f"  {head}\n    {x.command}")
        if len(p.pilots) > PILOTS_SHOWN:
            con.print(f"  ... and {len(p.pilots) - PILOTS_SHOWN} more, of less value (--json lists every one)")
        con.print("then plan again with the pilots' traces added: rlsim plan --trace REF --trace pilot_pN.parquet ...")
    for w in p.warnings:
        con.print(f"[yellow]warning:[/yellow] {w}")
    for n in p.notes:
        con.print(f"[dim]note: {n}[/dim]")


def register(app: typer.Typer) -> None:
    @command(app, "plan", whatif="grid",
             help="Which batch size to run, or which pilot runs would decide it most cheaply (by expected regret).",
             study_help={"trace": "Recorded trace: the first is the reference; repeat to add the pilot runs' traces "
                                  "(other batch sizes, run to the target or a prefix of one, which measure rho "
                                  "there; or the reference's configuration again with another seed, which reads "
                                  "the reference run's own luck)."})
    def plan_cmd(axes: dict, so: StudyOptions,
                 budget: Optional[float] = typer.Option(None, "--budget", help=default_text(
                     "Responses the pilots may spend in all.", "one reference run's")),
                 as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table")) -> None:
        extra = sorted(set(axes) - {"prompts", "group", "model_params"} - set(SHARED))
        if extra:
            raise RlsimError(f"rlsim plan takes candidate sizes (--prompts P1,P2,... and one --group), the model's "
                             f"--model-params and one execution mode with its settings and devices, not "
                             f"{', '.join(labels()[x] for x in extra)}")
        groups, params = axes.get("group", [None]), axes.get("model_params", [None])
        if len(groups) != 1:
            raise RlsimError("rlsim plan takes one --group for every candidate; plan each group separately")
        if len(params) != 1:
            raise RlsimError("rlsim plan takes one --model-params (the model's parameter count)")
        many = [k for k in SHARED if len(axes.get(k, ())) > 1]
        if many:
            raise RlsimError(f"rlsim plan takes one value of {', '.join(labels()[k] for k in many)} for every "
                             "candidate; plan each separately")
        fixed = tuple((k, axes[k][0]) for k in SHARED if k in axes)
        cfg = PlanConfig(prompts=tuple(axes.get("prompts", ())), group=groups[0], budget=budget,
                         model_params=params[0], fixed=fixed)
        cfg.validate()  # before the traces are read and fitted
        traces = read_traces(so)
        res = plan(traces[0], cfg, pilots=traces[1:], target=so.target)
        if as_json:
            typer.echo(dumps(res.to_dict(), indent=2))
        else:
            _print(res)
