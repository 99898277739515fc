"""Calibration profiles: engine steps at a ladder of concurrencies, training passes at a ladder of tokens.

Run by `rlrun record` after the warm-ups and before the first update (on by default, `--no-calibrate`
skips it), and alone by `rlrun calibrate`. Rows are `calib_gen` / `calib_train` (replay/schema.py); the
fit is replay/calibration.py. Weights and optimizer state are not changed (training passes compute and
discard gradients, `Trainer.profile`); the engine's prefix cache is reset afterwards. Times are on the
calibration's own clock (seconds from its start).

- warm state first: 1x passes until two agree (WARM_TOL), and each training visit a settling pass, then a
  recorded one: cold passes run slower per token;
- engine: half-octave rungs up to LADDER_FACTOR x the run's batch (capped by max_num_seqs and the KV cache),
  visited in shuffled rounds (randomised interleaving spreads drift over all rungs) until each rung's median
  meets SE_TARGET;
- training: forward + backward at TRAIN_FACTORS x the run's responses per update, in shuffled rounds too;
- one device: on a multi-core CPU run, paired visits at the run's threads and at one thread, for split what-ifs,
  and at one thread beside the other side on another core (`load_threads` rows: the two sides' interference);
- budget: BUDGET_FRACTION of the recording, split GEN_SHARE / DEVICE_SHARE; unmeasured levels: `calibration.skipped`.

In full: docs/usage.md, "Calibration profiles"; the measurements behind the choices: docs/results.md section 10.
"""
from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from rlsim.replay.schema import CALIB_GEN, CALIB_TRAIN, DRIFT_GEN, DRIFT_TRAIN
from rlsim.runner.summary import calibration_lines

LADDER_FACTOR = 16           # engine rungs up to this multiple of the run's batch (B = P x G sequences)
VISIT_STEPS = 6              # decode steps per visit of a rung at least ...
MAX_VISIT_STEPS = 16         # ... and at most (cheap rungs get more per visit)
VISIT_SECONDS = 0.12         # ... aiming at this many seconds per visit
WAVE_STEPS = 4               # decode steps per wave of the rung beyond the cap
SE_TARGET = 0.03             # relative standard error of each level's median to reach
MAX_ROUNDS = 6               # rounds of the shuffled ladder at most
TRAIN_FACTORS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # x the run's responses per update
WARM_TOL, WARM_PASSES = 0.05, 5  # warm 1x passes until two in a row agree within WARM_TOL (at most WARM_PASSES)
BUDGET_FRACTION = 0.10       # of the recording's estimated duration ...
BUDGET_MIN_S, BUDGET_S = 8.0, 60.0  # ... within these (BUDGET_S alone for `rlrun calibrate`)
GEN_SHARE = 0.35             # of the budget for the engine ladder (training passes cost more each)
DEVICE_SHARE = 0.2           # of the budget for the one-device pairs, when there are more devices than one ...
DEVICE_PAIRS = (2, 6)        # ... at least and at most this many pairs per side (engine, training)
DRIFT_LEVEL = 64             # the drift probe's engine visit: this many sequences (or the batch, if fewer) ...
DRIFT_TRAIN_FACTOR = 0.125   # ... and its training pass: this x the run's responses per update


def half_octaves(top: int) -> list[int]:
    """1, 1.4, 2, 2.8, 4, ... rounded and without repeats, below `top`, then `top`."""
    out, k = [], 0
    while True:
        n = int(round(2 ** (k / 2)))
        if n >= top:
            break
        if not out or n > out[-1]:
            out.append(n)
        k += 1
    return out + [top]


def gen_ladder(batch: int, max_num_seqs: int, kv_tokens: int, block: int, ctx: int,
               factor: int = LADDER_FACTOR) -> tuple[list[int], int | None]:
    """(concurrency rungs, wave rung or None): half-octaves up to min(factor x batch, cap), where cap is
    max_num_seqs or the sequences of `ctx` tokens the KV cache holds; then the wave rung when capped."""
    per_seq = -(-ctx // max(block, 1)) * max(block, 1)
    cap = max(1, min(max_num_seqs, kv_tokens // max(per_seq, 1) if kv_tokens else max_num_seqs))
    top = max(1, factor * batch)
    wave = min(top, cap + cap // 2) if top > cap and cap >= 2 else None
    return half_octaves(min(top, cap)), wave


def median_se(x) -> float:
    """Relative standard error of the median of x: 1.2533 x robust sigma / sqrt(n) / median (nan below 3 values)."""
    x = np.asarray(x, float)
    if len(x) < 3:
        return math.nan
    med = float(np.median(x))
    sigma = 1.4826 * float(np.median(np.abs(x - med)))
    return 1.2533 * sigma / math.sqrt(len(x)) / med if med > 0 else math.nan


@dataclass
class Ladder:
    """Measurements of one ladder: level -> values (seconds of decode steps, or of passes per token)."""
    values: dict[int, list[float]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def add(self, level: int, vals) -> None:
        self.values.setdefault(level, []).extend(vals)

    def open(self, levels, min_n: int) -> list[int]:
        """Levels that still need measuring: fewer than min_n values, or a standard error above SE_TARGET."""
        out = []
        for lv in levels:
            v = self.values.get(lv, [])
            se = median_se(v)
            if len(v) < min_n or not (se <= SE_TARGET):
                out.append(lv)
        return out

    def median(self, level: int) -> float | None:
        v = self.values.get(level)
        return float(np.median(v)) if v else None

    def summary(self, key: str) -> list[dict[str, Any]]:
        return [{key: lv, "n": len(v), "median_s": float(np.median(v)), "se": median_se(v)}
                for lv, v in sorted(self.values.items())]


class _Calibration:
    """One calibration's state: the clock, the rows written, the prompts handed out."""

    def __init__(self, engine, trainer, cfg, prompts, responses, log, rng: random.Random):
        self.engine, self.trainer, self.cfg, self.log, self.rng = engine, trainer, cfg, log, rng
        self.prompts, self.responses = prompts, responses
        self.t0 = time.perf_counter()
        self.rows: list[tuple[str, dict[str, Any]]] = []
        self.next_prompt = 0
        self.threads: int | None = None  # recorded on the rows: the thread count they were measured at
        self.load: int | None = None     # ... and the other side's threads working beside them (None: alone)
        self.kinds, self.step = (CALIB_GEN, CALIB_TRAIN), 0  # the drift probe writes its own kinds, on its step

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    # ------------------------------------------------------------------------------------------ engine
    def visit(self, level: int, steps: int, record: bool = True) -> list[float]:
        """Submit `level` sequences (requests of G) for steps + 1 tokens; one row per engine step (unless `record` is
        off); returns the decode steps' seconds at full concurrency (the first step is the prefill, a wave's are
        mixed)."""
        G = max(self.cfg.G, 1)
        reqs, left = [], level
        while left > 0:
            k = min(G, left)
            reqs.append((None, self.prompts[self.next_prompt % len(self.prompts)], k))
            self.next_prompt += 1
            left -= k
        durs: list[tuple[int, float]] = []

        def on_step(s):
            durs.append((s.num_running, s.duration))
            if record:
                self.rows.append((self.kinds[0], dict(
                    t_start=s.t_start, duration=s.duration, step=self.step, policy_version=self.step,
                    num_running=s.num_running, num_waiting=s.num_waiting, prefill_tokens=s.prefill_tokens,
                    decode_tokens=s.decode_tokens, context_tokens=s.context_tokens, kv_usage=s.kv_usage,
                    finished=s.finished, calib_level=level, threads=self.threads, **self._load())))

        self.engine.generate(reqs, self.engine.sampling(steps + 1, self.cfg.temperature, ignore_eos=True), on_step)
        top = max((n for n, _ in durs), default=0)
        return [d for n, d in durs[1:] if n == top]

    def gen_ladder(self, rungs: list[int], wave: int | None, room: int, budget_end: float) -> Ladder:
        """Round 1 upwards (each rung's cost bounds the next one's, so the budget check is sound), then shuffled
        rounds over the rungs whose median is not yet within SE_TARGET; the wave rung once. Stops at the budget."""
        lad = Ladder()
        for rnd in range(MAX_ROUNDS):
            todo = lad.open(rungs, VISIT_STEPS)
            if rnd == 0 and wave:
                todo.append(wave)
            if not todo:
                break
            if rnd:
                self.rng.shuffle(todo)
            for level in todo:
                n_run = min(level, rungs[-1])
                est = self._step_estimate(lad, rungs, n_run)
                steps = VISIT_STEPS if est is None else int(min(MAX_VISIT_STEPS,
                                                                max(VISIT_STEPS, math.ceil(VISIT_SECONDS / est))))
                steps = WAVE_STEPS if level == wave else min(steps, room)
                waves = -(-level // rungs[-1])
                if est is not None and self.clock() + waves * (steps + 1) * est > budget_end:
                    continue
                lad.add(level, self.visit(level, steps))
            if self.clock() >= budget_end:
                break
        lad.skipped = [f"gen {lv}" for lv in rungs + ([wave] if wave else []) if lv not in lad.values]
        return lad

    @staticmethod
    def _step_estimate(lad: Ladder, rungs: list[int], n: int) -> float | None:
        """Seconds of a step at n: its own median, else the nearest lower rung's scaled by n (an upper bound)."""
        own = lad.median(n)
        if own is not None:
            return own
        below = [r for r in rungs if r < n and lad.median(r) is not None]
        return lad.median(below[-1]) * n / below[-1] if below else None

    # ------------------------------------------------------------------------------------------ training
    def batch(self, R: int):
        """R samples, G per prompt (the run's grouping), real response lengths."""
        from rlsim.runner.algo import Sample

        G = max(self.cfg.G, 1)
        out = []
        for i in range(R):
            j = i // G
            resp = self.responses[(i * 7 + j) % len(self.responses)] or [self.trainer.pad_id]
            out.append(Sample(prompt_ids=self.prompts[j % len(self.prompts)], response_ids=list(resp),
                              reward=float(i % 2), prompt_id=j, group_index=i % G, advantage=1.0 if i % 2 else -1.0))
        return out

    def train_pass(self, samples, level: int, record: bool = True, micro: int | None = None) -> tuple[float, int]:
        """One forward + backward of `samples` (micro-batches of `micro` responses, None: as an update of their
        size): (seconds, tokens); a row unless `record` is off."""
        t0 = self.clock()
        st = self.trainer.profile(samples, micro)
        if record:
            self.train_row(t0, st, len(samples), level)
        return st.t_forward + st.t_backward, st.num_tokens

    def train_row(self, t0: float, st, responses: int, level: int) -> None:
        """A `calib_train` row (or the drift probe's kind) for a pass that started at `t0` with stats `st`."""
        self.rows.append((self.kinds[1], dict(t_start=t0, duration=st.t_forward + st.t_backward, step=self.step,
                                            policy_version=self.step, num_responses=responses, num_tokens=st.num_tokens,
                                            t_forward=st.t_forward, t_backward=st.t_backward, calib_level=level,
                                            threads=self.threads, **self._load())))

    def _load(self) -> dict[str, int]:
        """The `load_threads` field of a row measured beside the other side (none otherwise: drift rows lack it)."""
        return {} if self.load is None else {"load_threads": self.load}

    def warm(self, samples, lad: Ladder | None = None) -> float:
        """Passes of `samples` until two in a row agree within WARM_TOL: seconds per token of the last. That pass
        followed one of its own size, as a ladder visit's recorded pass does, so it is recorded into `lad` (at
        level len(samples)) when the two agreed."""
        last = None
        for _ in range(WARM_PASSES):
            t0 = self.clock()
            st = self.trainer.profile(samples, None)
            d = st.t_forward + st.t_backward
            per = d / max(st.num_tokens, 1)
            if last is not None and abs(per / last - 1) <= WARM_TOL:
                if lad is not None:
                    self.train_row(t0, st, len(samples), len(samples))
                    lad.add(len(samples), [d])
                return per
            last = per
        return last or math.nan

    def train_ladder(self, batches: dict[int, list], per_tok: float, budget_end: float,
                     lad: Ladder | None = None) -> Ladder:
        """Round 1 from the smallest level up (levels first: a level's visit costs twice its passes, so the cheap ones
        buy the count a curve needs, and the budget then buys range; the warm per-token cost prices each), then
        shuffled rounds over the levels (responses -> samples) whose median is not yet within SE_TARGET. Stops at
        the budget. `lad`: values measured before (the warm-up's settled 1x pass)."""
        lad = lad or Ladder()
        tokens = {R: sum(len(s.prompt_ids) + len(s.response_ids) for s in b) for R, b in batches.items()}
        for rnd in range(MAX_ROUNDS):
            todo = lad.open(list(batches), 3)
            if rnd:
                self.rng.shuffle(todo)
            else:
                todo.sort()
            for R in todo:
                if R not in batches or self.clock() + 2 * per_tok * tokens[R] > budget_end:
                    continue  # above a level that ran out of memory, or over budget
                try:
                    self.train_pass(batches[R], R, record=False)  # settles the switch from the previous size
                    d, tok = self.train_pass(batches[R], R)
                except RuntimeError as e:  # out of memory on a device: the level and those above are dropped
                    if "out of memory" not in str(e).lower():
                        raise
                    lad.skipped.append(f"train {R} (out of memory)")
                    _free_device_memory()
                    batches = {k: v for k, v in batches.items() if k < R}
                    continue
                per_tok = max(per_tok, d / max(tok, 1))
                lad.add(R, [d])
            if not todo or self.clock() >= budget_end:
                break
        lad.skipped += [f"train {R}" for R in batches if R not in lad.values]
        return lad


def run_calibration(engine, trainer, cfg, prompts: list[list[int]], responses: list[list[int]],
                    log: Callable[[str], None] = lambda m: None, budget_s: float | None = None,
                    threads: int | None = None, device_threads: Callable[[int], Any] | None = None,
                    interference: bool = False) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """Profile the engine and the trainer. `prompts`: token ids of task prompts; `responses`: token ids of
    real sampled responses (their lengths). `budget_s`: fixed budget (None: BUDGET_FRACTION of the run).
    `threads`: the CPU threads the run uses (recorded on the rows; None off CPU). `device_threads`: a context manager
    factory, `device_threads(k)` runs its body on device k's threads (the k-th core; 0 the engine's in a split, 1 the
    trainer's), or None. `interference`: the one-device pairs also measure each side beside the other (two devices
    at least). Returns the rows (kind, fields) and the metadata section."""
    cal = _Calibration(engine, trainer, cfg, prompts, responses, log, random.Random(cfg.seed + 7919))
    cal.threads = threads
    old_clock = engine.clock
    engine.clock = cal.clock
    G = max(cfg.G, 1)
    p_max = max(len(p) for p in prompts)
    room = max(engine.max_model_len - p_max - 2, VISIT_STEPS)
    rungs, wave = gen_ladder(cfg.gen_responses, engine.max_num_seqs, engine.kv_cache_tokens, engine.block_size,
                             p_max + min(room, MAX_VISIT_STEPS + 1))
    batches = {max(G, int(round(f * cfg.responses_per_update / G)) * G): None for f in TRAIN_FACTORS}
    batches = {R: cal.batch(R) for R in sorted(batches)}
    one = batches.get(max(G, cfg.responses_per_update // G * G)) or cal.batch(max(G, cfg.responses_per_update // G * G))
    train0 = Ladder()
    per_tok = cal.warm(one, train0 if batches.get(len(one)) is one else None)
    t_warm = cal.clock()
    budget, est = (budget_s, None) if budget_s is not None else _budget(cfg, cal, per_tok, batches)
    t_timing = cal.clock()
    cal.visit(wave or rungs[-1], WAVE_STEPS, record=False)  # the engine's largest batch first: its memory is held
    setup_s = cal.clock()
    share = (1 - DEVICE_SHARE) if device_threads else 1.0
    gen = cal.gen_ladder(rungs, wave, room, setup_s + GEN_SHARE * share * budget)
    t_gen = cal.clock()
    train = cal.train_ladder(batches, per_tok, t_gen + (1 - GEN_SHARE) * share * budget, train0)
    t_train = cal.clock() - t_gen
    info: dict[str, Any] = {"budget_s": budget, "factor": LADDER_FACTOR, "se_target": SE_TARGET,
                            "setup": {"warm_s": t_warm, "timing_s": t_timing - t_warm, "held_s": setup_s - t_timing},
                            "gen_s": t_gen - setup_s, "train_s": t_train, "gen_rungs": gen.summary("level"),
                            "train_levels": train.summary("responses"), "skipped": gen.skipped + train.skipped,
                            "run_levels": {"gen": min(cfg.gen_responses, rungs[-1]), "train": len(one)}}
    if est is not None:
        info.update(estimate_s=est, fraction=BUDGET_FRACTION)
    if device_threads:
        micro = one[:trainer.micro_for(len(one))]
        info["device"] = _device_pairs(cal, device_threads, min(cfg.gen_responses, rungs[-1]), micro,
                                       cal.clock() + DEVICE_SHARE * budget, interference)
    engine.engine.reset_prefix_cache()
    engine.clock = old_clock
    info["duration_s"] = cal.clock()
    for line in calibration_lines(info):  # what `rlrun inspect` prints of it
        log(line)
    return cal.rows, info


def _budget(cfg, cal: _Calibration, per_tok: float, batches: dict[int, list]) -> tuple[float, float]:
    """(budget, estimate): BUDGET_FRACTION of the recording: steps x (one round's generation, timed by generating one
    batch as the run does: B sequences in requests of G, the run's sampling, unrecorded; + one update at the warm
    per-token cost), plus its evals (eval_prompts x eval_k sequences each, priced per sequence alike), within
    [BUDGET_MIN_S, BUDGET_S]; the estimate before those bounds."""
    G = max(cfg.G, 1)
    reqs = [(None, cal.prompts[j % len(cal.prompts)], G) for j in range(max(1, cfg.gen_responses // G))]
    t0 = time.perf_counter()
    cal.engine.generate(reqs, cal.engine.sampling(cfg.max_tokens, cfg.temperature))
    round_s = time.perf_counter() - t0
    one_x = min(batches, key=lambda R: abs(R - cfg.responses_per_update))
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in batches[one_x])
    evals = (cfg.steps // cfg.eval_every if cfg.eval_every else 0) + 2
    run_s = (cfg.steps * (round_s + per_tok * tokens)
             + evals * round_s * cfg.eval_prompts * cfg.eval_k / max(cfg.gen_responses, 1))
    est = BUDGET_FRACTION * run_s
    return (float(min(BUDGET_S, max(BUDGET_MIN_S, est))) if math.isfinite(est) else BUDGET_S), float(est)


def _device_pairs(cal: _Calibration, device_threads, level: int, samples: list, end: float,
                  interference: bool = False) -> dict[str, Any]:
    """One device's speed beside the run's, paired: engine visits of `level` sequences (the run's concurrency), then
    forward + backward passes of `samples` (one micro-batch of the run's update, at its shape: a speed-up from
    threads depends on the operations' sizes), each at the run's threads and at one device's (`device_threads(k)`: on
    device k) in ABBA order (a drift within two pairs cancels), until the ratios' standard error is within SE_TARGET
    or the calibration's clock reaches `end` (DEVICE_PAIRS: at least, at most). With `interference` each pair also
    measures the side at one thread with the other side working beside it (`_loaded_engine`, `_loaded_train`): the
    `shared` ratios, loaded over alone. The fit scales the run's models by them (replay/device_speed.py); this phase's
    rows (from `t0` on the calibration's clock) stay out of the ladders' fits."""
    t0, run_threads = cal.clock(), cal.threads
    R = len(samples)

    def engine_visit() -> float:
        return float(np.median(cal.visit(level, VISIT_STEPS)))

    def train_visit() -> float:
        cal.train_pass(samples, R, record=False, micro=R)  # settles the switch of size or threads
        return cal.train_pass(samples, R, micro=R)[0]

    def one(fn, device: int = 0):
        return lambda: _at_one(cal, device_threads, fn, device)

    # with interference, the training alone on the device it runs on beside the engine (a split's trainer's)
    ways = {"gen": {"run": engine_visit, "one": one(engine_visit)},
            "train": {"run": train_visit, "one": one(train_visit, 1 if interference else 0)}}
    if interference:
        ways["gen"]["loaded"] = lambda: _loaded_engine(cal, device_threads, engine_visit, samples)
        ways["train"]["loaded"] = lambda: _loaded_train(cal, device_threads, train_visit, level)
    gen = _paired(cal, ways["gen"], t0 + max(0.0, end - t0) / 2)
    train = _paired(cal, ways["train"], end)
    out = {"threads": 1, "run_threads": run_threads, "t0": t0, "gen_level": level, "gen_ratios": gen["one"],
           "train_level": R, "train_ratios": train["one"]}
    if interference:
        out.update(load_threads=1, gen_shared_ratios=gen["loaded"], train_shared_ratios=train["loaded"])
    return {**out, "duration_s": cal.clock() - t0}


def _paired(cal: _Calibration, ways: dict[str, Callable[[], float]], end: float) -> dict[str, list[float]]:
    """Visits of every way in `ways` ("run" first, then "one", then "loaded" if there) in forward then reversed order,
    until `end` (DEVICE_PAIRS) or until the one-thread ratios' standard error is within SE_TARGET: per way but "run",
    its ratios ("one": over "run"; "loaded": over "one", within the same pair)."""
    names = list(ways)
    ratios: dict[str, list[float]] = {"one": [], "loaded": []}
    last = 0.0  # seconds of the last pair: the next one starts only if one like it ends by `end`
    for k in range(DEVICE_PAIRS[1]):
        if k >= DEVICE_PAIRS[0] and (cal.clock() + last > end
                                     or all(median_se(ratios[w]) <= SE_TARGET for w in ratios if w in ways)):
            break
        t = cal.clock()
        got = {w: ways[w]() for w in (names if k % 2 == 0 else names[::-1])}
        ratios["one"].append(got["one"] / got["run"])
        if "loaded" in got:
            ratios["loaded"].append(got["loaded"] / got["one"])
        last = cal.clock() - t
    return ratios


def _at_one(cal: _Calibration, device_threads, fn, device: int = 0, load: int | None = None):
    """`fn` on one device (`device_threads(device)`), its rows marked at 1 thread (and `load`: the other side's
    threads working beside it)."""
    threads = cal.threads
    cal.threads, cal.load = 1, load
    try:
        with device_threads(device):
            return fn()
    finally:
        cal.threads, cal.load = threads, None


def _loaded_engine(cal: _Calibration, device_threads, engine_visit, samples: list) -> float:
    """An engine visit on device 0 at one thread while training passes of `samples` run on device 1 (a thread of
    this process, pinned as a split's trainer is: its operators run outside the interpreter lock)."""
    R = len(samples)
    with _Beside(lambda: cal.trainer.profile(samples, R), lambda: device_threads(1), loop=True):
        return _at_one(cal, device_threads, engine_visit, 0, 1)


def _loaded_train(cal: _Calibration, device_threads, train_visit, level: int) -> float:
    """A training visit on device 1 at one thread (a thread, as in `_loaded_engine`) while engine visits of `level`
    sequences run on device 0 in this thread (the engine stays on the thread that made it)."""
    threads = cal.threads
    cal.threads, cal.load = 1, 1
    try:
        with device_threads(0), _Beside(train_visit, lambda: device_threads(1), loop=False) as bg:
            while not bg.done():
                cal.visit(level, VISIT_STEPS, record=False)
    finally:
        cal.threads, cal.load = threads, None
    return bg.result


class _Beside:
    """`fn` in a thread of its own inside `ctx()` (one device): repeatedly until the `with` block ends (`loop`), or
    once; the block's end waits for it, and raises what it raised. The other side of a split, beside a measurement."""

    def __init__(self, fn: Callable[[], Any], ctx: Callable[[], Any], loop: bool):
        self.fn, self.ctx, self.loop = fn, ctx, loop
        self.started, self.stop = threading.Event(), threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            with self.ctx():
                self.started.set()
                while True:
                    self.result = self.fn()
                    if not self.loop or self.stop.is_set():
                        break
        except BaseException as e:  # re-raised in the measuring thread
            self.error = e
        finally:
            self.started.set()

    def done(self) -> bool:
        return not self.thread.is_alive()

    def __enter__(self) -> _Beside:
        self.thread.start()
        self.started.wait()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        if self.error is not None and exc[0] is None:
            raise self.error


class DriftProbe:
    """The fixed probe `rlrun record` repeats every few updates (module doc of replay/drift.py): one engine visit
    of min(DRIFT_LEVEL, B) sequences and one training pass of DRIFT_TRAIN_FACTOR x the batch, on the run's clock
    (the engine's, set by the loop), as `drift_gen` / `drift_train` rows of the update after which it ran."""

    def __init__(self, engine, trainer, cfg, prompts: list[list[int]], responses: list[list[int]],
                 clock: Callable[[], float], threads: int | None = None):
        self.cal = _Calibration(engine, trainer, cfg, prompts, responses, None, random.Random(cfg.seed))
        self.cal.clock = clock  # the run's clock, not the calibration's own
        self.cal.kinds, self.cal.threads = (DRIFT_GEN, DRIFT_TRAIN), threads
        G = max(cfg.G, 1)
        self.level = min(DRIFT_LEVEL, cfg.gen_responses)
        self.samples = self.cal.batch(max(G, int(round(DRIFT_TRAIN_FACTOR * cfg.responses_per_update / G)) * G))

    def __call__(self, step: int) -> list[tuple[str, dict[str, Any]]]:
        """Run the probe after update `step`; its rows."""
        self.cal.rows, self.cal.step = [], step
        self.cal.visit(self.level, VISIT_STEPS)
        self.cal.train_pass(self.samples, len(self.samples))
        return self.cal.rows


def _free_device_memory() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # pragma: no cover
        pass
