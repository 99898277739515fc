"""Calibration profiles: engine steps at a ladder of concurrencies, training passes at a ladder of tokens.

Run by `rlrun record` after the warm-ups and before the first update (on by default, `--no-calibrate`
skips it), and alone by `rlrun calibrate`. Rows are `calib_gen` / `calib_train` (replay/schema.py); the
fit is replay/calibration.py. Weights and optimizer state are not changed (training passes compute and
discard gradients, `Trainer.profile`); the engine's prefix cache is reset afterwards. Times are on the
calibration's own clock (seconds from its start).

- engine: rungs of 1, 2, 4, ... sequences up to LADDER_FACTOR x the run's batch, capped by
  `max_num_seqs` and by the KV cache (sequences of the longest calibration context that fit); when the
  ladder is capped, one more rung submits min(LADDER_FACTOR x batch, 1.5 x cap) sequences, so it runs in
  two waves (admissions with prefill beside full-batch decode steps). Each rung submits its sequences as the
  run does (requests of n = G samples), prompts drawn from the task's own training distribution (a
  stream seeded apart from the run's), with `ignore_eos` and max_tokens sized so that the rung has at
  least MIN_DECODE_STEPS steps at its concurrency (more for cheap rungs, up to RUNG_SECONDS): the
  median of a rung is then stable. Every engine step is one row: num_running, context, prefill, duration.
- training: forward + backward of TRAIN_FACTORS x the run's responses per update (1/8 to 8), built
  from real sampled responses (the engine warm-up's) grouped G per prompt as the run's batches are,
  micro-batched as an update of that size would be.
- budget: the calibration stops adding rungs once BUDGET_S is spent (the skipped rungs are listed in the
  metadata `calibration.skipped`).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

from rlsim.replay.schema import CALIB_GEN, CALIB_TRAIN

LADDER_FACTOR = 16           # engine rungs up to this multiple of the run's batch (B = P x G sequences)
MIN_DECODE_STEPS = 6         # decode steps per rung at least ...
MAX_DECODE_STEPS = 16        # ... and at most
RUNG_SECONDS = 0.12          # ... aiming at this many seconds per rung
TRAIN_FACTORS = ((0.125, 2), (1.0, 1), (8.0, 1))  # (x the run's responses per update, passes)
WAVE_STEPS = 4               # decode steps per wave of the rung beyond the cap
BUDGET_S = 60.0              # hard cap on the calibration's wall time


def gen_ladder(batch: int, max_num_seqs: int, kv_tokens: int, block: int, ctx: int,
               factor: int = LADDER_FACTOR) -> tuple[list[int], int | None]:
    """(concurrency rungs, wave rung or None): 1, 2, 4, ... up to min(factor x batch, cap), where cap is
    max_num_seqs or the sequences of `ctx` tokens the KV cache holds; then the wave rung when capped."""
    per_seq = -(-ctx // max(block, 1)) * max(block, 1)
    cap = max(1, min(max_num_seqs, kv_tokens // max(per_seq, 1) if kv_tokens else max_num_seqs))
    top = max(1, factor * batch)
    rungs, n = [], 1
    while n < min(top, cap):
        rungs.append(n)
        n *= 2
    rungs.append(min(top, cap))
    wave = min(top, cap + cap // 2) if top > cap and cap >= 2 else None
    return rungs, wave


def run_calibration(engine, trainer, cfg, prompts: list[list[int]], responses: list[list[int]],
                    log: Callable[[str], None] = lambda m: None, budget_s: float = BUDGET_S
                    ) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """Profile the engine and the trainer. `prompts`: token ids of task prompts; `responses`: token ids of
    real sampled responses (their lengths). Returns the rows (kind, fields) and the metadata section."""
    from rlsim.runner.algo import Sample

    T0 = time.perf_counter()
    clock = lambda: time.perf_counter() - T0  # noqa: E731
    old_clock = engine.clock
    engine.clock = clock
    rows: list[tuple[str, dict[str, Any]]] = []
    skipped: list[str] = []
    G = max(cfg.G, 1)
    B = cfg.gen_responses
    p_max = max(len(p) for p in prompts)
    room = max(engine.max_model_len - p_max - 2, MIN_DECODE_STEPS)
    rungs, wave = gen_ladder(B, engine.max_num_seqs, engine.kv_cache_tokens, engine.block_size,
                             p_max + min(room, MAX_DECODE_STEPS + 1))
    info: dict[str, Any] = {"gen_rungs": [], "train_levels": [], "factor": LADDER_FACTOR, "budget_s": budget_s}
    next_prompt = 0
    prev: tuple[int, float] | None = None  # (num_running, median step seconds) of the last rung

    def rung(level: int, steps: int) -> list[float]:
        nonlocal next_prompt
        reqs, left = [], level
        while left > 0:
            k = min(G, left)
            reqs.append((None, prompts[next_prompt % len(prompts)], k))
            next_prompt += 1
            left -= k
        durs: list[float] = []

        def on_step(s):
            durs.append(s.duration)
            rows.append((CALIB_GEN, dict(t_start=s.t_start, duration=s.duration, step=0, policy_version=0,
                                         num_running=s.num_running, num_waiting=s.num_waiting,
                                         prefill_tokens=s.prefill_tokens, decode_tokens=s.decode_tokens,
                                         context_tokens=s.context_tokens, kv_usage=s.kv_usage, finished=s.finished,
                                         calib_level=level)))

        # the first token comes with the prefill step: steps + 1 tokens give `steps` decode steps
        engine.generate(reqs, engine.sampling(steps + 1, cfg.temperature, ignore_eos=True), on_step)
        return durs

    t_gen = clock()
    plan = [(n, False) for n in rungs] + ([(wave, True)] if wave else [])
    for level, is_wave in plan:
        n_run = min(level, rungs[-1])
        # a step at n_run costs at most the last rung's median scaled by the concurrency (the fixed part scales too)
        est = prev[1] * n_run / max(prev[0], 1) if prev else None
        steps = MAX_DECODE_STEPS if est is None else int(min(MAX_DECODE_STEPS, max(MIN_DECODE_STEPS, math.ceil(RUNG_SECONDS / max(est, 1e-6)))))
        steps = WAVE_STEPS if is_wave else min(steps, room)
        waves = -(-level // rungs[-1])
        if est is not None and clock() + waves * (steps + 1) * est > budget_s:
            skipped.append(f"gen {level}")
            continue
        durs = rung(level, steps)
        decode = sorted(durs[1:]) or durs
        med = decode[len(decode) // 2]
        prev = (n_run, med)
        info["gen_rungs"].append({"level": level, "steps": len(durs), "median_s": med, "wave": is_wave})
    info["gen_s"] = clock() - t_gen
    engine.engine.reset_prefix_cache()
    engine.clock = old_clock

    # training: batches of f x B responses, G per prompt, real response lengths
    t_train = clock()
    per_tok = None
    for f, passes in TRAIN_FACTORS:
        R = max(G, int(round(f * cfg.batch / G)) * G)
        samples = []
        for i in range(R):
            j = i // G
            resp = responses[(i * 7 + j) % len(responses)] or [trainer.pad_id]
            samples.append(Sample(prompt_ids=prompts[j % len(prompts)], response_ids=list(resp), reward=float(i % 2),
                                  prompt_id=j, group_index=i % G, advantage=1.0 if i % 2 else -1.0))
        est_tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
        if per_tok is not None and clock() + passes * per_tok * est_tokens > budget_s:
            skipped.append(f"train {R}")
            continue
        for _ in range(passes):
            t0 = clock()
            try:
                st = trainer.profile(samples)
            except RuntimeError as e:  # out of memory on a device: the level is skipped, the run goes on
                if "out of memory" not in str(e).lower():
                    raise
                skipped.append(f"train {R} (out of memory)")
                _free_device_memory()
                break
            dur = st.t_forward + st.t_backward
            rows.append((CALIB_TRAIN, dict(t_start=t0, duration=dur, step=0, policy_version=0, num_responses=R,
                                           num_tokens=st.num_tokens, t_forward=st.t_forward, t_backward=st.t_backward,
                                           calib_level=R)))
            per_tok = max(dur / max(st.num_tokens, 1), per_tok or 0.0)
            info["train_levels"].append({"responses": R, "tokens": st.num_tokens, "seconds": dur})
    info["train_s"] = clock() - t_train
    info["duration_s"] = clock()
    info["skipped"] = skipped
    log(f"calibration: {info['duration_s']:.1f} s (engine {info['gen_s']:.1f} s at {len(info['gen_rungs'])} rungs "
        f"{rungs[0]}..{wave or rungs[-1]}, training {info['train_s']:.1f} s at {len(info['train_levels'])} passes)"
        + (f"; skipped over budget: {', '.join(skipped)}" if skipped else ""))
    return rows, info


def _free_device_memory() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # pragma: no cover
        pass
