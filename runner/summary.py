"""A human summary of a trace (`rlrun inspect`). Needs only the trace format (no torch)."""
from __future__ import annotations

import math

import numpy as np

from rlsim.replay.devices import profile_for_hardware
from rlsim.replay.drift import drift_of
from rlsim.replay.errors import RlsimError
from rlsim.replay.io import read_trace
from rlsim.replay.probe import is_probe, probe_sigma
from rlsim.replay.schema import EVENT_KINDS, placement
from rlsim.replay.split_stats import split_stats
from rlsim.replay.steps import step_table


def _f(x, fmt=".3f") -> str:
    try:
        return format(float(x), fmt) if x is not None and np.isfinite(float(x)) else "-"
    except (TypeError, ValueError):
        return str(x)


def step_split(trace) -> dict[str, float]:
    """Totals (seconds) of the RL-step phases and eval over the recorded run."""
    st = step_table(trace)
    n = len(st["step"])
    if n == 0:
        return {}
    tot = {k: float(np.nansum(st[k]))
           for k in ("step_time", "gen_time", "update_time", "sync_time", "reward_time", "num_responses")}
    step, gen, train = tot["step_time"], tot["gen_time"], tot["update_time"]
    sync, reward = tot["sync_time"], tot["reward_time"]
    return {"steps": n, "step": step, "gen": gen, "train": train, "sync": sync, "reward": reward,
            "other": max(0.0, step - gen - train - sync - reward),
            "eval": float(np.nansum(trace.rows("eval")["duration"])), "responses": tot["num_responses"]}


def split_lines(trace) -> list[str]:
    """A split recording: placement, measured idle ratios, staleness and overlap (rlsim.replay.split_stats)."""
    s = split_stats(trace)
    pl = placement(trace.config)
    pct = lambda x: f"{100 * x:.1f}%" if np.isfinite(x) else "-"  # noqa: E731
    return [f"split      {s.gen_devices} generation engine{'s' if s.gen_devices != 1 else ''} : {s.train_devices} "
            f"trainer rank{'s' if s.train_devices != 1 else ''}, max staleness {s.max_staleness}, partial rollout "
            f"{'on' if s.partial_rollout else 'off'}, off-policy {pl['off_policy']}"
            + (f" (cap {_f(pl['tis_cap'], 'g')})" if pl["off_policy"] != "none" else ""),
            f"measured   over {_f(s.window[0], '.1f')}..{_f(s.window[1], '.1f')} s "
            f"({'after the first 2 updates' if trace.count('update') > 2 else 'the whole run'}, evals left out): "
            f"{_f(s.responses_per_s, '.1f')} responses/s; generator idle {pct(s.gen_idle_ratio)}, trainer idle "
            f"{pct(s.train_idle_ratio)}; generation overlapped training {_f(s.overlap_s, '.1f')} s",
            f"staleness  mean {_f(s.staleness_mean, '.2f')}, max {s.staleness_max} policy versions; "
            f"{s.partial_responses} responses spanned a weight sync"]


def _ratio(x: float) -> str:
    """A ratio to 3 decimals; a far-off one (a wide interval from few rounds) to 3 significant digits."""
    return _f(x, ".3f" if not np.isfinite(x) or 1e-3 <= abs(x) < 1e4 else ".3g")


def probe_lines(trace) -> list[str]:
    """A probe trace: each size's responses/s per round and sigma over the smallest size, paired by round
    (rlsim.replay.probe)."""
    ps = probe_sigma(trace)
    order = (trace.meta.get("probe") or {}).get("order") or []
    lines = [f"probe      {ps.rounds} round{'s' if ps.rounds != 1 else ''}, every size once per round in a shuffled "
             f"order: " + "; ".join(",".join(map(str, o)) for o in order[:ps.rounds])]
    rounds = [f"round {r + 1}" for r in range(ps.rounds)]
    lines.append("           " + f"{'P':>6} {'G':>4} {'B':>7}  " + "".join(f"{h:>9}" for h in rounds)
                 + f"  {'median':>9}  sigma (90 % interval)")
    for r in ps.rows:
        iv = f" ({_ratio(r.sigma_lo)}..{_ratio(r.sigma_hi)})" if np.isfinite(r.sigma_lo) else ""
        lines.append("           " + f"{r.prompts:>6} {r.group:>4} {r.responses:>7}  "
                     + "".join(f"{_f(v, '.1f'):>9}" for v in r.per_round) + f"  {_f(r.responses_per_s, '.1f'):>9}  "
                     + f"{_ratio(r.sigma)}x{iv}")
    lines.append("sigma      responses/s (num_responses / step_time) of each size over the smallest's in the same "
                 f"round; geometric mean over rounds, {ps.interval}")
    return lines


def _config_line(t) -> str:
    m, c = t.meta, t.config
    if is_probe(t):  # the options its steps share; the sizes are the probe's
        pr = m.get("probe") or {}
        return (f"config     {c.get('algo')} probe P={','.join(map(str, pr.get('sizes') or []))} G={c.get('group')} "
                f"rounds={pr.get('rounds')} lr {c.get('lr_rule')} rule from {_f(c.get('lr'), '.1e')} at "
                f"B_ref={c.get('lr_ref_batch')} task={c.get('dataset') or c.get('task')} "
                f"max_tokens={c.get('max_tokens')} T={c.get('temperature')} seed={m.get('seed')}")
    return (f"config     {c.get('algo')} P={c.get('prompts')} G={c.get('group')} B={c.get('batch')} "
            f"lr={_f(c.get('lr_effective'), '.2e')} ({c.get('lr_rule')} rule from {_f(c.get('lr'), '.1e')} at "
            f"B_ref={c.get('lr_ref_batch')}) steps={c.get('steps')} task={c.get('dataset') or c.get('task')} "
            f"max_tokens={c.get('max_tokens')} T={c.get('temperature')} eval every {c.get('eval_every')} "
            f"(k={c.get('eval_k')}, {c.get('eval_prompts')} prompts) seed={m.get('seed')}")


# A ladder that measured fewer than this share of its planned levels (the rest did not fit the budget, or ran out of
# memory) leaves its fit few levels to choose a form by and to interpolate between: warned.
LADDER_MIN_SHARE = 0.5
# One device's speed against the run's (`calibration.device`: seconds at one thread over seconds at the run's N threads)
# is plausible within [DEVICE_RATIO_RANGE[0], DEVICE_RATIO_RANGE[1] x N]: one core does the same work without the
# run's parallelism, so it takes between as long (nothing ran in parallel) and N times as long (all of it did); the
# margins leave room for a shared host's noise within a pair. A ratio outside says the host was disturbed during the
# pairs, and a split what-if's per-device costs (replay/device_speed.py) would inherit it: warned.
DEVICE_RATIO_RANGE = (0.5, 1.5)


def _levels(entries: list[dict], key: str, unit: str) -> str:
    """'N levels LO..HI unit (median SE x %, worst y %)' of a calibration ladder's metadata entries."""
    lv = [r.get(key) for r in entries if r.get(key) is not None]
    se = np.array([r.get("se") for r in entries if r.get("se") is not None], float)
    se = se[np.isfinite(se)]
    n = len(set(lv))
    out = f"{n} level{'' if n == 1 else 's'} {min(lv, default=0)}..{max(lv, default=0)} {unit}"
    return out + (f" (standard error of a level's median {100 * np.median(se):.1f} %, worst {100 * se.max():.1f} %)"
                  if len(se) else "")


def _train_key(cal: dict) -> str:
    train = cal.get("train_levels") or []
    return "responses" if any("responses" in r for r in train) else "tokens"  # older traces list token counts


def calibration_lines(cal: dict) -> list[str]:
    """The calibration: what it measured, in how long, and how precisely (metadata `calibration`), then its warnings
    (`calibration_warnings`). `rlrun record` prints these lines as it ends the calibration, `rlrun inspect` from the
    trace's metadata: one text for both."""
    if not cal:
        return []
    key = _train_key(cal)
    budget = f" (budget {_f(cal.get('budget_s'), '.0f')} s)" if cal.get("budget_s") else ""
    est, floor = cal.get("estimate_s"), ""
    if isinstance(est, (int, float)) and isinstance(cal.get("budget_s"), (int, float)) and est < cal["budget_s"]:
        floor = (f"; the budget is its floor: {100 * float(cal.get('fraction') or 0):.0f} % of this recording would be "
                 f"{_f(est, '.1f')} s")
    parts = cal.get("setup")  # seconds before the ladders, outside the budget: warm passes, timing batch, held visit
    setup = f"setup {_f(sum(parts.values()), '.1f')} s; " if isinstance(parts, dict) and parts and all(
        isinstance(v, (int, float)) for v in parts.values()) else ""
    out = [f"calibrate  {_f(cal.get('duration_s'), '.1f')} s before the run{budget}: {setup}engine "
           f"{_f(cal.get('gen_s'), '.1f')} s at {_levels(cal.get('gen_rungs') or [], 'level', 'sequences')}; training "
           f"{_f(cal.get('train_s'), '.1f')} s at {_levels(cal.get('train_levels') or [], key, key)}"
           + (f"; not measured: {', '.join(map(str, cal['skipped']))}" if cal.get("skipped") else "") + floor]
    dev = cal.get("device")
    if dev and "gen_ratios" in dev:
        def pairs(r):
            return f"x{np.median(r):.2f} ({len(r)} pairs: {', '.join(f'{x:.2f}' for x in r)})" if r else "not measured"
        out.append(f"one device {_f(dev.get('duration_s'), '.1f')} s, one core against the run's threads, paired: "
                   f"engine steps {pairs(dev['gen_ratios'])} at {dev.get('gen_level')} sequences; training "
                   f"{pairs(dev.get('train_ratios') or [])} at one micro-batch of {dev.get('train_level')} responses")
        if dev.get("gen_shared_ratios") or dev.get("train_shared_ratios"):
            out.append(f"interfere  one core beside the other side on another (as a split), over alone: engine steps "
                       f"{pairs(dev.get('gen_shared_ratios') or [])}; training "
                       f"{pairs(dev.get('train_shared_ratios') or [])}")
    elif dev:
        out.append(f"one device {_f(dev.get('duration_s'), '.1f')} s at {dev.get('threads')} thread: engine "
                   f"{_levels(dev.get('gen_rungs') or [], 'level', 'sequences')}; training "
                   f"{_levels(dev.get('train_levels') or [], 'responses', 'responses')}")
    return out + [f"warning    {w}" for w in calibration_warnings(cal)]


def _short_ladders(cal: dict) -> list[str]:
    """Each ladder that measured less than LADDER_MIN_SHARE of its planned levels, or none at or above the run's own
    level (metadata `run_levels`), in words."""
    key = _train_key(cal)
    skipped = [(str(s).split() or [""])[0] for s in cal.get("skipped") or []]  # 'gen 1536', 'train 512 (out of memory)'
    run_levels = cal.get("run_levels") if isinstance(cal.get("run_levels"), dict) else {}
    out = []
    for kind, entries, lk, unit in (("gen", cal.get("gen_rungs") or [], "level", "engine levels"),
                                    ("train", cal.get("train_levels") or [], key, "training levels")):
        got = sorted({r[lk] for r in entries if isinstance(r.get(lk), (int, float))})
        planned = len(got) + skipped.count(kind)
        own = run_levels.get(kind)
        low = isinstance(own, (int, float)) and (not got or got[-1] < own)
        if planned and (len(got) < LADDER_MIN_SHARE * planned or low):
            reach = f", up to {got[-1]:g}" if got else ""
            out.append(f"{len(got)} of {planned} {unit}{reach}" + (f" (below the run's own {own:g})" if low else ""))
    return out


def calibration_warnings(cal: dict) -> list[str]:
    """What makes a calibration's measurements doubtful: ladders left short (`_short_ladders`), one device's speed
    outside DEVICE_RATIO_RANGE. Empty when nothing is."""
    out = []
    short = _short_ladders(cal)
    if short:
        out.append(f"the calibration measured only {' and '.join(short)}: the rest did not fit its budget or "
                   "memory, so the step-cost fits rest on few levels and extrapolate beyond them; record more steps "
                   "(the budget grows with the recording), or run rlrun calibrate (a longer budget) with the same "
                   "model on the same machine and pass it to rlsim with --calibration")
    dev = cal.get("device") if isinstance(cal.get("device"), dict) else {}
    n = dev.get("run_threads") or cal.get("threads")
    known = isinstance(n, (int, float)) and not isinstance(n, bool) and n >= 1
    lo, hi = DEVICE_RATIO_RANGE[0], DEVICE_RATIO_RANGE[1] * n if known else math.inf
    ratios = (("engine", dev.get("gen_ratios")), ("training", dev.get("train_ratios")))
    bad = [f"{side} x{np.median(r):.2g}" for side, r in ratios
           if isinstance(r, list) and r and not lo <= float(np.median(r)) <= hi]
    if bad:
        within = f"{lo:g}..{hi:g}" if known else f"at least {lo:g}"
        out.append(f"one device's measured speed is implausible: {' and '.join(bad)} (one core's seconds over the "
                   f"run's {n if known else 'N'} threads'; plausible {within}: one core takes between as long as the "
                   "run's threads, nothing parallel, and that many times as long, all parallel, with a margin for "
                   "noise); the host was disturbed during the pairs, and a split what-if (--gen-gpus, --train-gpus) "
                   "scales one device's costs by these ratios: re-record on a quiet machine")
    return out


def drift_lines(t) -> list[str]:
    """The machine's speed over the run, from the drift probe (rlsim.replay.drift)."""
    d = drift_of(t)
    if d is None:
        return []
    (g0, g1), (t0, t1) = d.spread("gen"), d.spread("train")
    return [f"drift      {len(d.t)} probes: engine step {g0:.2f}x..{g1:.2f}x and training pass {t0:.2f}x..{t1:.2f}x of "
            "their median time over the run (the fit normalises the run's timings to the median)"]


def memory_lines(t) -> list[str]:
    """The measured memory peaks per phase over the updates (schema v5 columns; none measured: no line)."""
    u = t.rows("update")
    parts = []
    for name, col in (("generation", "mem_gen_peak_bytes"), ("training", "mem_train_peak_bytes")):
        v = u[col].astype(float) if col in u else np.array([])
        v = v[np.isfinite(v)] / 2 ** 30
        parts.append(f"{name} median {np.median(v):.3f}, max {v.max():.3f} GiB ({len(v)} updates)" if len(v)
                     else f"{name} not measured")
    if all(p.endswith("not measured") for p in parts):
        return []
    on_cpu = str((t.meta.get("hardware") or {}).get("device")) == "cpu"
    what = "the recording process's resident-set peak" if on_cpu else "torch's max_memory_allocated"
    return [f"memory     peak per update: {'; '.join(parts)} ({what})"]


def _profile(hw: dict) -> str:
    """'; device profile KEY (its source)': the figures `rlsim run --device` rescales this trace by ('' for none)."""
    try:
        p = profile_for_hardware(hw)
    except RlsimError:  # a profile key no rlsim knows: the line says what the trace says, no more
        return ""
    return f"; device profile {p.key} ({p.source})" if p is not None else ""


def summarize(path: str) -> str:
    t = read_trace(path)
    m, c = t.meta, t.config
    lines = [f"trace      {t.path}"]
    status = m.get("status", "?")
    if t.recovered:
        status += " (RECOVERED from the partial stream of a run that did not finish: every completed step is kept)"
    lines.append(f"status     {status}; schema v{m.get('schema_version')}; created {m.get('created', '?')}")
    if c:
        lines.append(_config_line(t))
    hw = m.get("hardware", {})
    if hw:
        lines.append(f"hardware   {hw.get('device')} {hw.get('device_name')} x{hw.get('device_count')}; "
                     f"{hw.get('cpu_cores')} CPU cores; {hw.get('memory_gb')} GB memory" + _profile(hw))
    mo = m.get("model", {})
    if mo:
        lines.append(f"model      {mo.get('architecture')} {mo.get('name')}: {mo.get('parameters'):,} parameters, "
                     f"hidden {mo.get('hidden')}, {mo.get('layers')} layers, {mo.get('heads')} heads x "
                     f"{mo.get('head_dim')}, vocab {mo.get('vocab')}")
    en = m.get("engine", {})
    if en:
        lines.append(f"engine     {en.get('name')} {en.get('version')}: start {_f(en.get('start_time_s'), '.1f')} s, "
                     f"max_num_seqs {en.get('max_num_seqs')}, KV cache {en.get('kv_cache_tokens')} tokens "
                     f"(block {en.get('block_size')}), dtype {en.get('dtype')}")
    pk = m.get("packages", {})
    if pk:
        lines.append("packages   " + ", ".join(f"{k} {v}" for k, v in pk.items()))
    lines.append("events     " + ", ".join(f"{k} {t.count(k)}" for k in EVENT_KINDS))
    if is_probe(t):
        return "\n".join(lines + probe_lines(t))
    lines += calibration_lines(m.get("calibration") or {}) + drift_lines(t)
    if placement(c)["mode"] == "split":
        lines += split_lines(t)
    sp = step_split(t)
    if sp and placement(c)["mode"] == "split":  # phases overlap: the trainer's view of its step
        tot = sp["step"] or float("nan")
        n_eng = max(1, int(placement(c)["gen_devices"]))
        lines.append(f"step time  {sp['steps']} steps, {_f(sp['step'] / sp['steps'])} s mean (trainer's view): waited "
                     f"for responses {100 * sp['gen'] / tot:.1f}%, training {100 * sp['train'] / tot:.1f}%, weight "
                     f"sync {100 * sp['sync'] / n_eng / tot:.1f}% (per engine), rewards "
                     f"{100 * sp['reward'] / tot:.1f}%; evals run on engine 0 beside the training requests")
        lines.append(f"throughput {_f(sp['responses'] / sp['step'], '.1f')} responses/s over RL steps; "
                     f"{int(sp['responses'])} responses")
    elif sp:
        tot = sp["step"] or float("nan")
        lines.append(f"step time  {sp['steps']} steps, {_f(sp['step'] / sp['steps'])} s mean: "
                     f"generation {100 * sp['gen'] / tot:.1f}%, training {100 * sp['train'] / tot:.1f}%, "
                     f"sync {100 * sp['sync'] / tot:.1f}%, reward/adv {100 * sp['reward'] / tot:.1f}%, "
                     f"other {100 * sp['other'] / tot:.1f}%; evals took {_f(sp['eval'], '.1f')} s more")
        wall = sp["step"] + sp["eval"]
        lines.append(f"throughput {_f(sp['responses'] / sp['step'], '.1f')} responses/s over RL steps "
                     f"({_f(sp['responses'] / wall, '.1f')} incl. evals); {int(sp['responses'])} responses")
        u = t.rows("update")
        lines.append(f"update     loss {_f(u['loss'][-1])} (last), reward {_f(u['reward'][0])} -> "
                     f"{_f(u['reward'][-1])}, grad norm {_f(np.nanmean(u['grad_norm']))} full / "
                     f"{_f(np.nanmean(u['grad_norm_micro']))} micro (micro-batch {int(u['micro_batch'][0])}), forward "
                     f"{_f(np.nansum(u['t_forward']), '.1f')} s, backward {_f(np.nansum(u['t_backward']), '.1f')} s, "
                     f"optimizer {_f(np.nansum(u['t_optimizer']), '.1f')} s")
        if np.isfinite(u["critic_loss"].astype(float)).any():
            lines.append(f"critic     loss {_f(u['critic_loss'][-1])} (last), grad norm "
                         f"{_f(np.nanmean(u['critic_grad_norm']))} full / "
                         f"{_f(np.nanmean(u['critic_grad_norm_micro']))} micro")
    lines += memory_lines(t)
    r = t.rows("response")
    if len(r["kind"]):
        L = r["response_tokens"].astype(float)
        lines.append(f"responses  length mean {L.mean():.1f}, p50 {np.percentile(L, 50):.0f}, p95 "
                     f"{np.percentile(L, 95):.0f}, max {L.max():.0f} tokens; mean reward "
                     f"{np.nanmean(r['reward'].astype(float)):.3f}")
    g = t.rows("gen_step")
    if len(g["kind"]):
        lines.append(f"gen steps  {len(g['kind'])} engine steps, {_f(np.mean(g['duration']) * 1e3, '.1f')} ms mean, "
                     f"{_f(np.mean(g['num_running']), '.0f')} running mean, {_f(np.max(g['num_running']), '.0f')} max")
    e = t.rows("eval")
    if len(e["kind"]):
        lines.append("eval       version  responses   wall s   score")
        for v, n, ts, s in zip(e["policy_version"], e["cum_responses"], e["t_start"], e["score"]):
            lines.append(f"           {int(v):7d}  {int(n):9d}  {ts:7.1f}  {s:.3f}")
    return "\n".join(lines)
