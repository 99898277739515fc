"""Cost models from a step-level trace (a verl / OpenRLHF / TRL log imported by `rlsim import`).

A step-level trace has, per RL step, the time of each phase (generation, rewards, old log-probs and
reference, the update, a weight sync), the batch, the tokens trained on, and the step's length
statistics, but no engine-step or per-response rows. `fit_steps` builds the same `FittedModels` as
`fit.fit_trace` so that the simulator runs unchanged:

- generation: each step's engine-step features (steps, running sequences, context, prefill) from a stand-in
  for its responses (a shifted log-normal matched to the logged length statistics), then NNLS of the logged
  generation time on them; with one batch size the per-step cost may come from the roofline prior
  (`replay.devices`), with a warning;
- update, prep, reward, sync and the rest of the step: `robust.fit_affine` against tokens, responses, bytes;
- lengths: the stand-in samples of all steps pooled;
- a log that times only whole steps (TRL): generation from the roofline priors alone, training the rest.

Every fit says in `warnings` that the fidelity is lower than from an `rlrun record` trace, and why.
Imports neither torch nor SimPy. In detail: docs/importing.md, "How a step-level trace is fitted".
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

from rlsim.replay.cost import StepSums
from rlsim.replay.devices import profile_for_hardware
from rlsim.replay.errors import RlsimError
from rlsim.replay.io import Trace
from rlsim.replay.models import FittedModels, GenOverheadModel, GenStepModel, LengthModel, Recorded
from rlsim.replay.robust import (NARROW_RANGE, AffineModel, FitQuality, fit_affine, fit_quality, nnls_fit,
                                 robust_location)
from rlsim.replay.schema import GEN_STEP, PHASE, STEP_STATS, SYNC, UPDATE
from rlsim.replay.steps import step_table, step_times

STANDIN_SAMPLES_TOTAL = 200_000   # pooled length samples kept for the simulator's sampling
WORKLOAD_LIMIT = 4_000_000        # per-step workloads (for `rlsim replay`) kept up to this many responses
# The high end of generation's share of a step when a log times whole steps only: the highest share in the phase-level
# published runs transcribed in bench/published (verl's H20 tables: 0.30-0.70 of the step, docs/results.md section 7).
GEN_SHARE_HI = 0.7
C_STEP_MAX_REL_SE = 0.25          # a fitted c_step is trusted when its standard error is below this fraction
_NORMAL = NormalDist()
DEFAULT_SIGMA = 0.6               # log-normal shape when a log gives only the mean length
# A GPU engine step's cost beyond reading the weights (scheduling, sampling, kernel launches, the tensor-parallel
# all-reduces of each layer), seconds, added to the roofline c_step prior of an imported log. vLLM's own profile:
# "the GPU is idle for a significant portion of time" between steps, CPU scheduling and input preparation taking
# up to half of a step for Llama-3-8B on one H100 (vLLM blog, "vLLM v0.6.0: 2.7x Throughput Improvement and 5x
# Latency Reduction", 2024-09-05). No log identifies it; its value is fitted on published runs leave-one-source-out
# (bench/published.py --fit, docs/results.md "Published runs at GPU scale").
ENGINE_STEP_OVERHEAD_S = 0.0


def is_step_level(trace: Trace) -> bool:
    """A trace imported from another framework's log: per-step phase rows instead of engine steps."""
    if trace.meta.get("granularity") == "step":
        return True
    return trace.count(GEN_STEP) == 0 and (trace.count(PHASE) > 0 or trace.count(STEP_STATS) > 0)


# ------------------------------------------------------------------------------------------ lengths
def lognormal_lengths(n: int, mean: float, lo: float = math.nan, hi: float = math.nan, clip: float = math.nan,
                      cap: float | None = None) -> np.ndarray:
    """`n` lengths (floats >= 1, ascending) at quantiles (i + 0.5) / n of a shifted log-normal
    lo + LogNormal(mu, sigma), capped at `cap`, matched to the logged mean; sigma from the maximum (the
    largest of the n quantiles, kept exact) or, when clip > 0, from the clip ratio at the cap. Only the mean known:
    shift 0 and sigma DEFAULT_SIGMA. The sample mean is then set to `mean` exactly."""
    if n <= 0:
        return np.zeros(0)
    if not math.isfinite(mean) or mean <= 0:
        raise RlsimError(f"a length mean of {mean!r} tokens: the log's length statistics are missing or corrupt")
    cap_v = float(cap) if cap and math.isfinite(cap) else math.inf
    lo = float(lo) if math.isfinite(lo) else 0.0
    lo = max(min(lo, mean), 0.0)
    D = mean - lo
    q = (np.arange(n) + 0.5) / n
    if D <= 1e-9:
        return np.full(n, float(mean))
    clip = float(clip) if math.isfinite(clip) else 0.0
    if clip > 0 and math.isfinite(cap_v) and cap_v > mean:
        T = cap_v - lo
        zc = _ndtri(1.0 - min(clip, 0.999))

        def f(s: float) -> float:  # censored mean of lo + Y minus the logged mean
            return T * math.exp(-zc * s + s * s / 2) * 0.5 * math.erfc((s - zc) / math.sqrt(2)) + T * clip - D

        sigma = _falling_root(f, 1e-4, 12.0) if f(1e-4) > 0 > f(12.0) else DEFAULT_SIGMA
        mu = math.log(T) - zc * sigma
    elif math.isfinite(hi) and hi > mean:
        z = _ndtri(1.0 - 0.5 / n)  # the largest of the n quantiles lands on the logged maximum
        r = math.log((hi - lo) / D)
        sigma = z - math.sqrt(z * z - 2 * r) if z * z > 2 * r else z
        sigma = max(sigma, 1e-3)
        mu = math.log(D) - sigma * sigma / 2
    else:
        sigma = DEFAULT_SIGMA
        mu = math.log(D) - sigma * sigma / 2
    x = lo + np.exp(mu + sigma * np.array([_ndtri(v) for v in q.tolist()]))
    x = np.minimum(x, cap_v)
    free = x < cap_v
    if clip <= 0 and math.isfinite(hi) and hi > mean and n > 1:
        x[-1] = min(hi, cap_v)  # keep the logged maximum exact: the others absorb the mean correction
        free[-1] = False
    if free.any():  # the discrete sample's mean exactly the logged mean (scale the unclipped part)
        want = mean * n - x[~free].sum() - lo * free.sum()
        have = (x[free] - lo).sum()
        if have > 0 and want > 0:
            x[free] = lo + (x[free] - lo) * (want / have)
    return np.clip(x, 1.0, cap_v)


def _ndtri(p: float) -> float:
    """The standard normal quantile (the stdlib's, C-accelerated: scipy.special and scipy.optimize take longer to
    import than a run of an imported log spends fitting it)."""
    return _NORMAL.inv_cdf(p)


def _falling_root(f, a: float, b: float, tol: float = 1e-12) -> float:
    """The root of f in [a, b] where f(a) > 0 > f(b), by bisection to `tol`."""
    while b - a > tol:
        m = 0.5 * (a + b)
        a, b = (m, b) if f(m) > 0 else (a, m)
    return 0.5 * (a + b)


def round_features(resp: np.ndarray, prompt: np.ndarray, max_num_seqs: int, prefill_ratio: float,
                   rng: np.random.Generator) -> tuple[float, float, float, float]:
    """(engine steps K, sum of running sequences S1, sum of context S2, prefill tokens S3) of one round
    of requests with response lengths `resp` and prompt lengths `prompt` (same length), in a shuffled
    queue order, under continuous batching with `max_num_seqs` slots (the simulator's semantics: a
    request of L tokens occupies L consecutive steps; context at its k-th step = prompt + k)."""
    L = np.maximum(np.round(resp), 1.0)
    p = np.asarray(prompt, float)
    order = rng.permutation(len(L))
    L, p = L[order], p[order]
    if len(L) <= max_num_seqs:
        K = float(L.max()) if len(L) else 0.0
    else:
        free = [0] * int(max_num_seqs)  # step at which each slot frees
        heapq.heapify(free)
        end = 0
        for x in L:
            start = heapq.heappop(free)
            e = start + int(x)
            heapq.heappush(free, e)
            end = max(end, e)
        K = float(end)
    sums = StepSums.of_requests(p, L, p * prefill_ratio, K)
    return K, float(sums.running), float(sums.context), float(sums.prefill)


# ------------------------------------------------------------------------------------------ priors
def _profile(meta: dict[str, Any]):
    try:
        return profile_for_hardware(meta.get("hardware") or {})
    except RlsimError:
        return None


def _priors(meta: dict[str, Any], overhead: float = 0.0) -> dict[str, Any]:
    """Priors: c_step (weights read once per engine step at the datasheet bandwidth, plus the engine's fixed
    per-step overhead `overhead`), per-token decode and prefill compute (roofline)."""
    prof = _profile(meta)
    model = meta.get("model") or {}
    hw = meta.get("hardware") or {}
    cfg = meta.get("config") or {}
    params = model.get("parameters")
    mbytes = model.get("bytes") or (2.0 * params if params else None)
    tp = int(hw.get("tp") or cfg.get("tp") or 1)
    gpus = int(hw.get("device_count") or cfg.get("gpus") or 0) or None
    out: dict[str, Any] = {"profile": prof, "params": params, "bytes": mbytes, "tp": tp, "gpus": gpus}
    if prof is not None and mbytes:
        read = float(mbytes) / (tp * prof.mem_bandwidth_gbs * 1e9)
        out["c_step"] = read + (overhead if prof.kind != "cpu" else 0.0)
        out["c_step_text"] = (f"model bytes {float(mbytes):.3g} / (tp {tp} x {prof.mem_bandwidth_gbs:g} GB/s, "
                              f"{prof.name} datasheet) = {read * 1e3:.3g} ms"
                              + (f" + the engine's per-step overhead {overhead * 1e3:.3g} ms"
                                 if overhead and prof.kind != "cpu" else ""))
    if prof is not None and params and gpus:
        out["c_token"] = 2.0 * float(params) / (gpus * prof.flops_tflops * 1e12)
    return out


# ------------------------------------------------------------------------------------------ fit
def _step_table(trace: Trace, tix: int) -> dict[str, np.ndarray]:
    """Per update row of one trace: batch, tokens, phase totals, length statistics (aligned by step)."""
    u = trace.rows(UPDATE)
    st = trace.rows(STEP_STATS)
    steps = u["step"].astype(np.int64)
    pos = {int(s): i for i, s in enumerate(st["step"].astype(np.int64))}
    idx = np.array([pos.get(int(s), -1) for s in steps])

    def stat(col: str) -> np.ndarray:
        v = st[col].astype(float) if len(st[col]) else np.zeros(0)
        return np.array([v[i] if i >= 0 else math.nan for i in idx], float)

    sy = trace.rows(SYNC)
    sync = np.zeros(len(steps))
    if len(sy["step"]):
        for s, d in zip(sy["step"].astype(np.int64), sy["duration"].astype(float)):
            sync[steps == s] += d
    out = {"trace": np.full(len(steps), tix), "step": steps, "B": u["num_responses"].astype(float),
           "tokens": u["num_tokens"].astype(float), "update": u["duration"].astype(float),
           "step_time": u["step_time"].astype(float), "gen": u["gen_time"].astype(float),
           "reward": np.nan_to_num(u["reward_time"].astype(float)), "prep": np.nan_to_num(u["prep_time"].astype(float)),
           "sync": sync}
    for col in ("response_len_mean", "response_len_min", "response_len_max", "response_clip_ratio",
                "prompt_len_mean", "prompt_len_min", "prompt_len_max", "prompt_clip_ratio"):
        out[col] = stat(col)
    return out


def fit_steps(traces: Trace | Sequence[Trace], *, step_overhead_s: float | None = None) -> FittedModels:
    """FittedModels from one step-level trace, or several of one setup (their batch sizes then give the
    batch-dependent terms a range; generation's lengths, the engine and the recorded timings come from
    the first). See the module doc."""
    traces = [traces] if isinstance(traces, Trace) else list(traces)
    ref = traces[0]
    for t in traces:
        if not is_step_level(t):
            raise RlsimError(f"{t.path} is an rlrun trace and {ref.path} a step-level (imported) one: fit them "
                             "separately")
        if t.count(UPDATE) == 0:
            raise RlsimError(f"{t.path} has no update rows: the imported log had no complete training step")
    meta = ref.meta
    src = meta.get("source") or {}
    cfg = dict(ref.config)
    eng_meta = dict(meta.get("engine") or {})
    G = int(cfg.get("group") or 1)
    M = int(eng_meta.get("max_num_seqs") or 1024)
    ratio = float(eng_meta.get("prefill_ratio") or 1.0)
    pri = _priors(meta, ENGINE_STEP_OVERHEAD_S if step_overhead_s is None else float(step_overhead_s))
    n_steps = sum(t.count(UPDATE) for t in traces)
    warnings = [f"step-level trace imported from {src.get('framework', 'another framework')} "
                f"({src.get('file', ref.name)}, {n_steps} steps): only per-step phase times were logged, no engine "
                "steps or responses, so generation is fitted on per-step totals with response lengths from a "
                "log-normal stand-in matched to the logged mean/min/max and clip ratio; expect larger errors than from "
                "an `rlrun record` trace"]
    if cfg.get("fully_async"):
        warnings.append("the imported run was fully asynchronous (verl fully_async: generation and training "
                        "overlapped); rlsim simulates the synchronous colocated loop, so its reference step time is "
                        "the sum of the phases")
    d = _steps_table(traces)
    sel = ~d["warm"] if (~d["warm"]).sum() >= 2 else np.ones(len(d["B"]), bool)
    st = _standins(d, traces, G, cfg.get("max_tokens"), cfg.get("max_prompt_tokens"), M, ratio, warnings)
    gen, base, gen_alt = _fit_generation(d, st.sums, sel, pri, M, warnings)
    gen_pred = base + gen.total(st.sums)
    has_gen = np.isfinite(d["gen"]) & (d["gen"] > 0)
    gen_time = np.where(has_gen, d["gen"], gen_pred)
    ph = _fit_phases(d, gen_time, gen_pred, has_gen, sel, float(pri.get("bytes") or 0.0), len(traces) > 1, warnings)
    m0 = d["trace"] == 0
    # the step time as every view reads it (replay/steps.py); the fit's own rebuild of unlogged steps uses its fits
    recorded = Recorded(step=d["step"][m0], step_time=step_table(ref)["step_time"], gen_time=gen_time[m0],
                        train_time=ph.update_s[m0] + d["prep"][m0], sync_time=d["sync"][m0], num_responses=d["B"][m0],
                        gen_steps=st.sums.steps[m0], workload=_standin_workload(d, st, G, warnings))
    cfg["hardware"] = dict(meta.get("hardware") or {})
    cfg.setdefault("tp", pri["tp"])
    if len(traces) > 1 and len({int(t.config.get("group") or 1) for t in traces}) > 1:
        warnings.append("the pooled traces differ in group size G; their stand-in lengths are pooled as they are")
    models = FittedModels(gen=gen,
                          gen_overhead=GenOverheadModel(base=base, per_response=0.0, per_step=0.0, quality=gen.quality),
                          lengths=_standin_lengths(st, G, cfg.get("max_tokens"), ratio), **ph.models,
                          sync_bytes=float(pri.get("bytes") or 0.0),
                          engine=_engine(eng_meta, M, cfg.get("max_tokens"), cfg.get("max_prompt_tokens")), config=cfg,
                          recorded=recorded, warnings=tuple(warnings), source=",".join(t.name for t in traces),
                          shared_prompts=False)
    if gen_alt is not None:
        return replace(models, alternative=replace(models, gen=gen_alt))
    alt = _whole_step_alternative(models, d, st.sums, base, sel, float(pri.get("bytes") or 0.0), len(traces) > 1) \
        if not has_gen.any() and gen.prior else None
    if alt is None:
        return models
    return replace(models, alternative=alt, warnings=models.warnings + (
        "a log of whole steps cannot tell generation's share of the step: predictions are also made with the per-step "
        f"generation cost raised until generation takes {GEN_SHARE_HI:.0%} of it, training the rest, for the "
        "interval",))


def _steps_table(traces: Sequence[Trace]) -> dict[str, np.ndarray]:
    """`_step_table` of the traces end to end, with `warm`: each trace's first step (compilation, allocator and
    cache warm-up) when it has more than 3."""
    tabs = [_step_table(t, i) for i, t in enumerate(traces)]
    d = {k: np.concatenate([tb[k] for tb in tabs]) for k in tabs[0]}
    warm = np.zeros(len(d["B"]), bool)
    for i in range(len(traces)):
        m = d["trace"] == i
        if m.sum() > 3:
            warm[np.argmin(np.where(m, d["step"], np.iinfo(np.int64).max))] = True
    d["warm"] = warm
    return d


@dataclass(frozen=True, eq=False)
class _Standins:
    """The stand-in workload of every step (module doc)."""

    sums: StepSums = field(metadata={"help": "(steps,) engine-step features of each step's round"})
    responses: list[np.ndarray] = field(metadata={"help": "per step: its B stand-in response lengths (ascending)"})
    prompts: list[np.ndarray] = field(metadata={"help": "per step: its stand-in prompt lengths, one per prompt"})


def _standins(d: dict[str, np.ndarray], traces: Sequence[Trace], G: int, cap, pcap, max_num_seqs: int, ratio: float,
              warnings: list[str]) -> _Standins:
    """Per step: stand-in response and prompt lengths from its logged statistics, and the features of its round."""
    n = len(d["B"])
    prompts_per = np.maximum(np.round(d["B"] / G), 1).astype(int)
    feats = np.zeros((n, 4))  # K, S1, S2, S3 per step
    resp, prompts = [], []
    only_mean = False
    for i in range(n):
        Bi = int(d["B"][i])
        mean = d["response_len_mean"][i]
        if not math.isfinite(mean):
            raise RlsimError(f"{traces[int(d['trace'][i])].path}: step {int(d['step'][i])} has no response length; the "
                             "log must give the mean response length per step")
        only_mean |= not math.isfinite(d["response_len_max"][i])
        r = lognormal_lengths(Bi, mean, d["response_len_min"][i], d["response_len_max"][i], d["response_clip_ratio"][i],
                              cap)
        pm = d["prompt_len_mean"][i]
        pr = (lognormal_lengths(int(prompts_per[i]), pm, d["prompt_len_min"][i], d["prompt_len_max"][i],
                                d["prompt_clip_ratio"][i], pcap)
              if math.isfinite(pm) else np.zeros(int(prompts_per[i])))
        p_full = np.repeat(pr, G)[:Bi] if len(pr) * G >= Bi else np.resize(pr, Bi)
        feats[i] = round_features(r, p_full, max_num_seqs, ratio,
                                  np.random.default_rng(int(d["step"][i]) + 7919 * int(d["trace"][i])))
        resp.append(r)
        prompts.append(pr)
    if only_mean:
        warnings.append("the log gives only the mean response length: the stand-in distribution has a log-normal "
                        f"shape sigma = {DEFAULT_SIGMA} (an assumption), so the engine steps per round are uncertain")
    return _Standins(StepSums(*feats.T), resp, prompts)


def _fit_generation(d: dict[str, np.ndarray], sums: StepSums, sel: np.ndarray, pri: dict[str, Any], max_num_seqs: int,
                    warnings: list[str]) -> tuple[GenStepModel, float, GenStepModel | None]:
    """The engine-step model and the per-round base from the logged generation times (module doc), or from the
    roofline priors when none was logged; and the model at the other end of c_step's range when the log cannot
    identify it (`_unidentified`)."""
    gen_y = d["gen"]
    fit_rows = sel & np.isfinite(gen_y) & (gen_y > 0)
    c_prefill = float(pri.get("c_token") or 0.0)
    dropped = int(len(gen_y) - fit_rows.sum())
    if fit_rows.sum() >= 3:
        y = gen_y[fit_rows] - c_prefill * sums.prefill[fit_rows]
        f = StepSums(sums.steps[fit_rows], sums.running[fit_rows], sums.context[fit_rows], sums.prefill[fit_rows])
        base, c_step, c_seq, c_ctx, prior_used, method = _fit_gen_rows(f, y, d["B"][fit_rows], pri, warnings)
        X = np.column_stack([np.ones(len(y)), f.steps, f.running, f.context, f.prefill])
        q = fit_quality(X, gen_y[fit_rows], np.array([base, c_step, c_seq, c_ctx, c_prefill]), dropped, method)
        alt = _unidentified(f, y, base, c_step, c_ctx, method)
    else:
        alt = None
        base = c_step = c_seq = c_ctx = 0.0
        prior_used = False
        # no generation time logged (TRL: whole steps): generation from the priors alone
        if "c_step" in pri and "c_token" in pri:
            c_step, c_seq, prior_used = pri["c_step"], pri["c_token"], True
            warnings.append("the log times whole steps only (no generation phase): generation is predicted from "
                            f"roofline priors alone ({pri['c_step_text']} per engine step, 2 x parameters FLOPs per "
                            "generated token at peak FLOP/s), a lower bound; training takes the rest of each step")
        else:
            warnings.append("the log times whole steps only and no roofline prior is available (import with --device "
                            "NAME and --model-params): the whole step is fitted against tokens, generation costs "
                            "nothing in the simulation, and sigma reflects tokens only")
        q = FitQuality(0, math.nan, math.nan, math.nan, math.nan, dropped, "prior" if prior_used else "default")
    gen = GenStepModel(c_step=c_step, c_seq=c_seq, c_ctx=c_ctx, c_prefill=c_prefill, quality=q, prior=prior_used,
                       concurrency_range=(int(min(d["B"].min(), max_num_seqs)), int(min(d["B"].max(), max_num_seqs))))
    warnings.append(_provenance(pri, prior_used, c_prefill > 0, fit_rows.sum() >= 3))
    if alt is not None:
        alt = replace(gen, c_step=alt[0], c_seq=alt[1])
        warnings.append("the log cannot tell the per-step generation cost from the per-token cost: c_step anywhere "
                        f"from {gen.c_step * 1e3:.3g} ms to {alt.c_step * 1e3:.3g} ms (the longest response's engine "
                        "steps taking up to 90 % of the round) fits it; predictions are made at both ends for the "
                        "interval")
    return gen, base, alt


def _whole_step_alternative(models: FittedModels, d: dict[str, np.ndarray], sums: StepSums, base: float,
                             sel: np.ndarray, model_bytes: float, pooled: bool) -> FittedModels | None:
    """A log of whole steps leaves generation's share unidentified: the priors give its low end; at the other, the
    per-step cost (what the roofline prior underestimates most: launches, attention, sampling, scheduling) rises
    until the median step's generation takes GEN_SHARE_HI of it, and training is refitted to the rest."""
    g = models.gen
    fixed = g.c_step * sums.steps
    per_token = base + g.total(sums) - fixed
    work = d["step_time"] - d["sync"]
    ok = sel & np.isfinite(work) & (fixed > 0)
    if not ok.any():
        return None
    c_step = g.c_step * float(np.median((GEN_SHARE_HI * work[ok] - per_token[ok]) / fixed[ok]))
    if not c_step > 1.05 * g.c_step:
        return None
    gen_hi = replace(g, c_step=c_step)
    pred_hi = base + gen_hi.total(sums)
    ph = _fit_phases(d, pred_hi, pred_hi, np.zeros(len(pred_hi), bool), sel, model_bytes, pooled, [])
    return replace(models, gen=gen_hi, **ph.models)


def _provenance(pri: dict[str, Any], step_prior: bool, prefill_prior: bool, gen_logged: bool) -> str:
    """One line: which terms the datasheet gave and which the log."""
    sheet = [t for t, used in (("the per-step generation cost (roofline)", step_prior),
                               ("the prefill cost per prompt token", prefill_prior),
                               ("the decode cost per token", step_prior and not gen_logged)) if used]
    logged = (["generation's per-token cost"] if gen_logged else []) + [
        "training, batch preparation, rewards, weight sync and the rest of the step"]
    if not sheet:
        return f"every term from the log ({', '.join(logged)}); no datasheet term"
    return f"terms from the {pri['profile'].name} datasheet: {', '.join(sheet)}; from the log: {', '.join(logged)}"


def _unidentified(f: StepSums, y: np.ndarray, base: float, c_step: float, c_ctx: float,
                  method: str) -> tuple[float, float] | None:
    """(c_step, c_seq) at the upper end of what a log at one batch size allows, or None when c_step was identified
    (several batch sizes, or the spread of engine steps). Upper end: the cap the prior is held to, 90 % of the
    smallest round's time per engine step; c_seq refitted (least squares through 0) to what is left."""
    if method.startswith("nnls over") or "spread" in method:  # identified across batch sizes or by the spread
        return None
    hi = 0.9 * float(np.min(y / np.maximum(f.steps, 1)))
    if not hi > 1.05 * c_step:
        return None
    rest = y - base - hi * f.steps - c_ctx * f.context
    run = f.running.astype(float)
    return hi, max(float(rest @ run / (run @ run)), 0.0) if run @ run > 0 else 0.0


def _fit_gen_rows(f: StepSums, y: np.ndarray, B: np.ndarray, pri: dict[str, Any],
                  warnings: list[str]) -> tuple[float, float, float, float, bool, str]:
    """(base, c_step, c_seq, c_ctx, prior used, method) of generation seconds y (prefill taken out) on the rounds'
    features f: across batch sizes by NNLS; at one batch size by NNLS when the spread of engine steps pins
    c_step, else with c_step from the roofline prior (or 0)."""
    sep_ctx = len(y) >= 6 and _span(f.context / f.running) >= NARROW_RANGE
    cols = [np.ones_like(y), f.steps, f.running] + ([f.context] if sep_ctx else [])
    Xs = np.column_stack(cols)
    if B.max() / max(B.min(), 1) >= NARROW_RANGE and len(y) >= 6:
        coef, _ = nnls_fit(Xs, y)
        base, c_step, c_seq = map(float, coef[:3])
        c_ctx = float(coef[3]) if sep_ctx else 0.0
        if c_step == 0.0 and "c_step" in pri:
            warnings.append("the per-step generation cost fitted to 0 across the batch sizes; the roofline prior "
                            f"would be {pri['c_step_text']}")
        return base, c_step, c_seq, c_ctx, False, f"nnls over {_span_text(B)} batch sizes"
    # with an intercept, c_step is identified only by how the engine steps vary, not by their level
    coef, keep = nnls_fit(Xs, y) if len(y) >= 8 else (np.zeros(Xs.shape[1]), np.ones(len(y), bool))
    se = _rel_se(Xs[keep], y[keep], coef, 1)
    Bv = int(np.median(B))
    if len(y) >= 8 and coef[1] > 0 and se < C_STEP_MAX_REL_SE:
        warnings.append(f"all steps ran at one batch size (B = {Bv}): the per-step generation cost c_step = "
                        f"{coef[1] * 1e3:.3g} ms comes from the step-to-step spread of the longest response alone "
                        f"(standard error {100 * se:.0f} %); traces at other batch sizes would pin it down")
        return (float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3]) if sep_ctx else 0.0, False,
                "nnls (c_step from the spread of engine steps)")
    c_step, prior_used = 0.0, False
    if "c_step" in pri:
        c_step = min(pri["c_step"], 0.9 * float(np.min(y / np.maximum(f.steps, 1))))
        prior_used = True
        warnings.append(f"all steps ran at one batch size (B = {Bv}), which cannot separate the per-step "
                        "generation cost (what a bigger batch amortises) from the per-token cost: c_step uses "
                        f"the roofline prior, {pri['c_step_text']}; real engine steps cost more (attention, "
                        "sampling, scheduling), so larger batches may gain more than predicted")
    else:
        warnings.append(f"all steps ran at one batch size (B = {Bv}) and no roofline prior is available "
                        "(import with --device NAME and --model-params, or a model path with its size): "
                        "generation is taken as costing per token only, so a bigger batch gains nothing in "
                        "generation (sigma from generation = 1)")
    rest = y - c_step * f.steps
    if sep_ctx:
        coef2, _ = nnls_fit(np.column_stack([np.ones_like(y), f.running, f.context]), rest)
        return (float(coef2[0]), c_step, float(coef2[1]), float(coef2[2]), prior_used,
                "prior+nnls" if prior_used else "nnls (per token)")
    am = fit_affine("gen", "response tokens", f.running, rest)
    return am.intercept, c_step, am.slope, 0.0, prior_used, ("prior+" if prior_used else "") + am.quality.method


@dataclass(frozen=True, eq=False)
class _Phases:
    """The phase models fitted on the logged phases (update: actor + critic; prep: old log-probs, reference and
    values), and the times they were fitted on."""

    models: dict[str, AffineModel] = field(metadata={"help": "fit.PHASES -> its fitted model"})
    update_s: np.ndarray = field(metadata={"help": "(steps,) update seconds (a whole step less generation and sync "
                                                   "when no phases)"})
    step_time: np.ndarray = field(metadata={"help": "(steps,) step seconds (the phases summed when not logged)"})


def _fit_phases(d: dict[str, np.ndarray], gen_time: np.ndarray, gen_pred: np.ndarray, has_gen: np.ndarray,
                sel: np.ndarray, model_bytes: float, pooled: bool, warnings: list[str]) -> _Phases:
    upd = d["update"].astype(float)
    # update rows holding the whole step
    upd = np.where(~has_gen, np.maximum(upd - gen_pred - d["sync"], 0.1 * upd), upd)
    grp = d["trace"][sel] if pooled else None
    step_time = step_times(d["step_time"], gen_time, d["reward"], d["prep"], upd, d["sync"])
    other_t = np.maximum(step_time - gen_time - d["reward"] - d["prep"] - upd - d["sync"], 0.0)
    if (d["sync"][sel] > 0).any():
        sync = fit_affine("sync", "bytes", np.full(int(sel.sum()), model_bytes), d["sync"][sel])
    else:
        sync = AffineModel("sync", "bytes", 0.0, 0.0,
                           FitQuality(0, math.nan, math.nan, math.nan, math.nan, 0, "default"))
    over = (gen_time + d["reward"] + d["prep"] + upd + d["sync"]) > 1.05 * step_time
    if over[sel].mean() > 0.2:
        warnings.append(f"in {int(over[sel].sum())} of {int(sel.sum())} steps the phases add up to more than the step "
                        "time (phases overlapped or nested); the simulator runs them one after the other")
    models = dict(update=fit_affine("update", "tokens", d["tokens"][sel], upd[sel], intercept_hint=0.0, groups=grp),
                  prep=fit_affine("prep", "tokens", d["tokens"][sel], d["prep"][sel], groups=grp),
                  reward=fit_affine("reward", "responses", d["B"][sel], d["reward"][sel], groups=grp),
                  other=fit_affine("other", "responses", d["B"][sel], other_t[sel],
                                   intercept_hint=robust_location(other_t[sel]), groups=grp),
                  sync=sync)
    return _Phases(models, update_s=upd, step_time=step_time)


def _standin_lengths(st: _Standins, G: int, cap, ratio: float) -> LengthModel:
    """The stand-in samples pooled (evenly thinned to a bounded size), reference trace first."""
    budget = max(STANDIN_SAMPLES_TOTAL // max(len(st.responses), 1), 16)
    r_pool = np.concatenate([_thin(r, budget) for r in st.responses])
    p_pool = np.concatenate([_thin(p, max(budget // G, 4)) for p in st.prompts])
    return LengthModel(prompt_tokens=np.maximum(np.round(p_pool), 1).astype(np.int32),
                       response_tokens=np.maximum(np.round(r_pool), 1).astype(np.int32),
                       max_tokens=int(cap or int(r_pool.max())), prefill_ratio=ratio)


def _standin_workload(d: dict[str, np.ndarray], st: _Standins, G: int, warnings: list[str]) -> tuple:
    """Per step of the first trace, its stand-in (prompt, response) lengths in a shuffled queue order (for
    `rlsim replay`); empty beyond WORKLOAD_LIMIT responses."""
    m0 = d["trace"] == 0
    if float(d["B"][m0].sum()) > WORKLOAD_LIMIT:
        warnings.append("the imported run is too large to keep per-step stand-in workloads: `rlsim replay` needs "
                        "--lengths sampled")
        return ()
    wl = []
    for i in np.nonzero(m0)[0]:
        Bi = int(d["B"][i])
        rr = np.maximum(np.round(st.responses[i]), 1).astype(np.int32)
        rr = rr[np.random.default_rng(int(d["step"][i])).permutation(len(rr))]
        pp = np.maximum(np.round(np.repeat(st.prompts[i], G)), 1).astype(np.int32)
        pp = np.resize(pp, Bi) if len(pp) != Bi else pp
        wl.append((pp, rr))
    return tuple(wl)


def _engine(eng_meta: dict[str, Any], max_num_seqs: int, cap, pcap) -> dict[str, Any]:
    """The simulator's engine limits from the log's engine metadata, defaults filled in."""
    engine = {k: v for k, v in eng_meta.items()
              if k in ("max_num_seqs", "kv_cache_tokens", "block_size", "max_model_len", "engines", "tensor_parallel",
                       "prefill_ratio", "name")}
    engine.setdefault("block_size", 16)
    engine.setdefault("max_model_len", int((pcap or 0) + (cap or 0)) or 4096)
    engine.setdefault("max_num_seqs", max_num_seqs)
    engine.setdefault("kv_cache_tokens", int(engine["max_num_seqs"]) * int(engine["max_model_len"]))
    return engine


def _span(x: np.ndarray) -> float:
    x = np.asarray(x, float)
    x = x[np.isfinite(x) & (x > 0)]
    return float(x.max() / x.min()) if len(x) else 1.0


def _span_text(x: np.ndarray) -> str:
    return f"{len(np.unique(np.round(x)))} ({int(np.min(x))}..{int(np.max(x))})"


def _rel_se(X: np.ndarray, y: np.ndarray, coef: np.ndarray, j: int) -> float:
    """Relative standard error of coef[j] under ordinary least squares on the rows given."""
    n, k = X.shape
    if n <= k or coef[j] <= 0:
        return math.inf
    res = y - X @ coef
    s2 = float(res @ res) / (n - k)
    try:
        cov = s2 * np.linalg.inv(X.T @ X)
    except np.linalg.LinAlgError:
        return math.inf
    v = cov[j, j]
    return math.sqrt(v) / coef[j] if v >= 0 else math.inf


def _thin(x: np.ndarray, m: int) -> np.ndarray:
    """At most m values of a sorted quantile sample, evenly spaced (keeps its distribution)."""
    if len(x) <= m:
        return np.asarray(x, float)
    idx = np.round(np.linspace(0, len(x) - 1, m)).astype(int)
    return np.asarray(x, float)[idx]
