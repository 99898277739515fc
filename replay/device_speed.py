"""One device's speed relative to the run's, from the calibration's paired visits (a CPU's device is a core).

A split what-if gives each engine replica and each trainer rank whole devices; a colocated CPU recording ran on
all its cores. `rlrun record` on more than one core therefore ends its calibration with a paired phase
(runner/calibrate.py `_device_pairs`): engine visits at the run's concurrency and passes of one micro-batch of
its update, alternately at the run's threads and at one thread (rows at one thread carry `threads` = 1; the
phase starts at the metadata's `calibration.device.t0`). One device's models are the run's fitted models (their
shape from the full ladders, their level anchored to the run) with engine-step times x `gen` and training times x
`train`, the ratios of one thread's seconds over the run threads' within the phase (`device_ratios`). Why paired
and at the run's shapes: a speed-up from threads depends on the operations' sizes, a drift between two
measurements cancels only within a pair, and a one-thread ladder of its own, within its share of the budget,
fell short of the run's concurrency and missed the split's operating point (docs/results.md sections 6 and 10).

Interference: a split's two sides share the machine (memory bandwidth, caches), so each runs slower beside the other
than alone. A calibration of schema 6 measures each side at one thread again while the other side works on another
core (rows with `load_threads`; metadata `gen_shared_ratios` / `train_shared_ratios`, loaded over alone within a
pair), kept in `DeviceRatios` to show, not applied by `rlsim.replay.devices.device_models`: the other side ran
as a thread of the same process, which a split's separate processes do not contend as (docs/results.md section 16).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rlsim.replay.errors import RlsimError
from rlsim.replay.io import Trace
from rlsim.replay.schema import CALIB_GEN, CALIB_TRAIN


def _device_meta(t: Trace) -> dict:
    """The metadata's `calibration.device` section ({} when absent), its numbers checked: one line naming a corrupt
    one."""
    dev = (t.meta.get("calibration") or {}).get("device") or {}
    if not isinstance(dev, dict):
        raise RlsimError(f"{t.path}: metadata calibration.device is {dev!r}, not a section; re-record the trace with "
                         "rlrun record")
    for key in ("gen_ratios", "train_ratios", "gen_shared_ratios", "train_shared_ratios"):
        v = dev.get(key)
        if v is not None and not (isinstance(v, list)
                                  and all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in v)):
            raise RlsimError(f"{t.path}: metadata calibration.device.{key} is {v!r}, not a list of positive ratios; "
                             "re-record the trace with rlrun record")
    t0 = dev.get("t0")
    if t0 is not None and not (isinstance(t0, (int, float)) and math.isfinite(t0)):
        raise RlsimError(f"{t.path}: metadata calibration.device.t0 is {t0!r}, not a time in seconds; "
                         "re-record the trace with rlrun record")
    return dev


def device_phase(t: Trace, kind: str) -> np.ndarray:
    """(rows,) True for the calibration rows of `kind` that measured one device: the paired phase (from the metadata's
    `calibration.device.t0` on, at both thread counts), or, in a trace without it, the rows at 1 thread (schema v4
    `threads`) beside a run on more. The ladders' fits leave them out."""
    r = t.rows(kind)
    dev = _device_meta(t)
    if "threads" not in r or not dev:
        return np.zeros(len(r["kind"]), bool)
    if "t0" in dev:
        return np.asarray(r["t_start"], float) >= float(dev["t0"])
    return np.asarray(r["threads"], float) == 1


@dataclass(frozen=True)
class DeviceRatios:
    """One device's seconds over the run's threads' seconds, each at one measured level."""

    gen: float = field(metadata={"help": "engine-step seconds at one thread / at the run's threads"})
    gen_level: int = field(metadata={"help": "the concurrency (sequences) the engine ratio was measured at"})
    train: float = field(metadata={"help": "forward + backward seconds at one thread / at the run's threads"})
    train_level: int = field(metadata={"help": "the training level (responses) the training ratio was measured at"})
    threads: int = field(metadata={"help": "the run's threads (the devices it ran on)"})
    gen_shared: float = field(default=1.0, metadata={
        "help": "engine-step seconds at one thread beside the training on another device / alone (1: not measured)"})
    train_shared: float = field(default=1.0, metadata={
        "help": "training seconds at one thread beside the engine on another device / alone (1: not measured)"})
    gen_shared_spread: float = field(default=0.0, metadata={
        "help": "robust standard deviation of the engine's loaded / alone ratios over the pairs"})
    train_shared_spread: float = field(default=0.0, metadata={
        "help": "robust standard deviation of the training's loaded / alone ratios over the pairs"})
    shared_pairs: int = field(default=0, metadata={"help": "pairs that measured the sides beside each other"})

    def describe(self) -> str:
        out = (f"one device's costs: the run's fitted costs with engine steps x{self.gen:.2f} (measured at "
               f"{self.gen_level} sequences) and training x{self.train:.2f} (at {self.train_level} responses), "
               f"one core at 1 thread against the run's {self.threads}, paired in its calibration")
        if self.shared_pairs:
            out += (f"; beside the other side on another core, engine steps x{self.gen_shared:.2f} "
                    f"(+-{self.gen_shared_spread:.2f}) and training x{self.train_shared:.2f} "
                    f"(+-{self.train_shared_spread:.2f}) more ({self.shared_pairs} pairs; shown, not applied: "
                    "measured beside a thread of the same process, which a split's processes do not contend as)")
        return out


def _ratio(t: Trace, kind: str, target: float) -> tuple[float, int] | None:
    """(median seconds at 1 thread / median at the run's threads, level): within the paired phase, else at the level
    both thread counts measured nearest `target` in log terms; engine rows: decode steps at their level's full
    concurrency."""
    r = t.rows(kind)
    if not len(r["kind"]):
        return None
    phase = device_phase(t, kind)
    if not phase.any():
        return None
    at_one, loaded = np.asarray(r["threads"], float) == 1, _loaded(r)  # loaded: neither alone nor the run's
    one = phase & at_one & ~loaded
    paired = "t0" in _device_meta(t)
    run = (phase if paired else True) & ~at_one & ~loaded
    level = np.asarray(r["calib_level"], float)
    dur = np.asarray(r["duration"], float)
    ok = np.isfinite(level) & (level > 0) & np.isfinite(dur)
    if kind == CALIB_GEN:  # the visit's decode steps at full concurrency (its first step is the prefill)
        ok &= (np.asarray(r["prefill_tokens"], float) == 0) & (np.asarray(r["num_running"], float) == level)
    common = sorted(set(level[ok & one]) & set(level[ok & run]))
    if not common:
        return None
    lv = min(common, key=lambda x: abs(math.log(x / max(target, 1e-9))))
    at = ok & (level == lv)
    return float(np.median(dur[at & one]) / np.median(dur[at & run])), int(lv)


def device_ratios(t: Trace) -> DeviceRatios | None:
    """One device's speed from `t`'s calibration (module doc): the median of the pairs' ratios the recording wrote,
    else the ratio of the rows' medians; None unless both the engine and the training were measured at one thread
    and at the run's threads at a common level."""
    cfg = t.config
    batch = float(cfg.get("prompts") or 1) * float(cfg.get("group") or 1)
    g, tr = _ratio(t, CALIB_GEN, batch), _ratio(t, CALIB_TRAIN, batch)
    if g is None or tr is None:
        return None
    dev = _device_meta(t)
    if dev.get("gen_ratios") and dev.get("train_ratios"):  # the pairs' own ratios: a drift between pairs cancels
        g, tr = (float(np.median(dev["gen_ratios"])), g[1]), (float(np.median(dev["train_ratios"])), tr[1])
    if not (g[0] > 0 and tr[0] > 0 and math.isfinite(g[0] * tr[0])):  # rows of zero seconds: nothing to scale by
        return None
    threads = (t.meta.get("calibration")
               or {}).get("threads") or (t.meta.get("hardware") or {}).get("torch_threads") or 1
    threads = int(threads) if isinstance(threads, (int, float)) and threads >= 1 else 1
    return DeviceRatios(gen=g[0], gen_level=g[1], train=tr[0], train_level=tr[1], threads=threads, **shared_ratios(t))


def _loaded(r: dict[str, np.ndarray]) -> np.ndarray:
    """(rows,) True for the rows measured beside the other side (`load_threads` set; schema 6)."""
    lt = r.get("load_threads")
    return np.zeros(len(r["kind"]), bool) if lt is None else np.nan_to_num(np.asarray(lt, float)) > 0


def _spread(x) -> float:
    x = np.asarray(x, float)
    return float(1.4826 * np.median(np.abs(x - np.median(x))))


def shared_ratios(t: Trace) -> dict[str, float | int]:
    """The interference fields of `DeviceRatios` (module doc): the medians and spreads of the pairs' loaded / alone
    ratios the calibration wrote; {} unless both sides have them (then each side costs as measured alone)."""
    dev = _device_meta(t)
    g, tr = dev.get("gen_shared_ratios"), dev.get("train_shared_ratios")
    if not g or not tr:
        return {}
    return {"gen_shared": float(np.median(g)), "train_shared": float(np.median(tr)), "gen_shared_spread": _spread(g),
            "train_shared_spread": _spread(tr), "shared_pairs": min(len(g), len(tr))}

