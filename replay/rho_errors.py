"""How far a sample cost predicted from one reference trace was from the measured one: the error curves that
`rlsim plan` draws its uncertainty from.

One curve per (study, reference seed): e(d) = log(rho measured / rho predicted) at d = log2(B / B_ref), where
rho predicted comes from that seed's reference trace alone (the noise-scale model, or rho = 1 for `invariant`)
and rho measured is the mean samples-to-target of the *other* seeds at B over theirs at B_ref (a run that never
reached the target counts at its budget, a lower bound). e(0) = 0. Between measured d the curve is linear; beyond
the measured range it is held at its end value (`span_note` says so: nothing measured the error further out).

Also measured there: `seed_sd`, the sd of log rho of one run around its configuration's seed mean (the noise of a
one-seed pilot); `truth_sd`, the noise of a seed mean of the other seeds (seed_sd / sqrt(seeds - 1)); `sigma_sd`,
the sd of log(sigma measured / sigma predicted); `shared_sd`, the part of the pilots' noise they share through
the one reference run they are all read against.

The numbers in `DATA` are written by `python -m bench.studies.plan_eval --write-errors` from the recorded studies
under traces/ (docs/results.md, "Decisions"); nothing here is set by hand. Pure numpy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from rlsim.replay.errors import RlsimError


@dataclass(frozen=True, eq=False)
class RhoErrors:
    """Measured error curves of reference-alone rho, and the noise levels that go with them."""

    d: np.ndarray = field(metadata={"help": "(m,) log2(B / B_ref) where the curves are measured, ascending"})
    curves: np.ndarray = field(metadata={"help": "(K, m) log(rho measured / rho predicted), one row per (study, "
                                                 "reference seed)"})
    sources: tuple[str, ...] = field(metadata={"help": "(K,) the study and seed of each curve"})
    seed_sd: float = field(metadata={"help": "sd of one run's log rho around its seed mean (a one-seed pilot's noise)"})
    truth_sd: float = field(metadata={"help": "sd of a study's seed mean of log rho (the curves' own noise)"})
    sigma_sd: float = field(metadata={
        "help": "sd of log(sigma measured / sigma predicted) on the studies (reported; rlsim plan takes sigma's spread "
                "from the trace's own intervals)"})
    model: str = field(default="noise-scale", metadata={"help": "the rho model whose errors these are"})
    mirrored: bool = field(default=True, metadata={
        "help": "draw each curve mirrored too: the noise-scale model's bend was misplaced in both directions, on "
                "different tasks (an invariant rho's errors have a known sign: rho rises with the batch)"})
    pilot_sigma_sd: float = field(default=0.0, metadata={
        "help": "sd of one run's log sigma (responses/s over the reference's, both one seed) around its seed mean: a "
                "one-seed pilot's sigma noise"})
    prefix_f: tuple[float, ...] = field(default=(), metadata={
        "help": "(f,) prefix lengths where a prefix's error was measured, as fractions of the reference's "
                "samples-to-target"})
    prefix_bias: tuple = field(default=(), metadata={
        "help": "(f,) mean of log(rho from a prefix / rho of the other seeds' means) at each prefix length "
                "(`rlsim.replay.learning.prefix_log_rho`), or (len(prefix_d), f) one row per batch ratio; () when not "
                "measured"})
    prefix_sd: tuple = field(default=(), metadata={
        "help": "its sd around that mean, shaped as prefix_bias: a prefix pilot's noise"})
    prefix_d: tuple[float, ...] = field(default=(), metadata={
        "help": "log2(B / B_ref) of prefix_bias's and prefix_sd's rows (empty: one row for every batch ratio). A "
                "prefix of a larger batch lags more early in training: its bias and noise grow with the ratio"})
    shared_sd: float = field(default=0.0, metadata={
        "help": "sd in log T of the part of a pilot's error that every pilot read against the same reference run "
                "shares (that run's own luck): the within-seed covariance of the pilots' errors; the rest of a "
                "pilot's noise is its own"})

    def at(self, d) -> np.ndarray:
        """(K, n) each curve at the n points d (linear between measured points, held at the ends beyond them); (2K, n)
        with each mirrored too (`mirrored`): the studies measured the bend misplaced in both directions, on different
        tasks, so which way a new task's errs is not known before a run at another size measures it."""
        d = np.asarray(d, float)
        at = np.stack([np.interp(d, self.d, c) for c in self.curves])
        return np.concatenate([at, -at]) if self.mirrored else at

    def span_note(self, d, names: Sequence[str] = ()) -> str:
        """A warning naming the candidates (`names`, one per d; else their count) that lie beyond the measured range
        of d ('' when none does)."""
        d = np.asarray(d, float)
        beyond = (d < self.d[0] - 1e-9) | (d > self.d[-1] + 1e-9)
        if not beyond.any():
            return ""
        which = (", ".join(n for n, b in zip(names, beyond) if b) if len(names) == len(d) else
                 f"{beyond.sum()} candidate(s)")
        return (f"{which} lie{'s' if beyond.sum() == 1 else ''} beyond the batch ratios where rho's error was measured "
                f"({2 ** self.d[0]:.3g}x..{2 ** self.d[-1]:.3g}x the reference): their error is held at the nearest "
                "measured one, which understates the uncertainty there")

    def describe(self) -> str:
        studies = sorted({s.rsplit(" seed", 1)[0] for s in self.sources})
        return (f"rho uncertainty: {len(self.curves)} measured error curves of the {self.model} model from one "
                f"reference ({', '.join(studies)}); a pilot's noise {self.seed_sd:.2f} in log rho"
                + (f"; {self.shared_sd:.2f} in log T shared by every pilot of one reference run"
                   if self.shared_sd > 0 else ""))

    def without(self, study: str) -> RhoErrors:
        """The curves of every study but `study` (leave-one-study-out)."""
        keep = np.array([not s.startswith(study + " seed") for s in self.sources])
        if not keep.any():
            raise RlsimError(f"no error curves left without study {study!r}")
        return replace(self, curves=self.curves[keep], sources=tuple(s for s, k in zip(self.sources, keep) if k))

    def prefix_noise(self, f: float, d: float = 0.0) -> tuple[float, float]:
        """(bias, sd) in log rho of a prefix of length f (a fraction of the reference's samples-to-target) at batch
        ratio d = log2(B / B_ref), linear between the measured lengths and ratios and held at the ends; (nan, nan)
        when no prefix was measured."""
        if not self.prefix_f:
            return math.nan, math.nan

        def at(table) -> float:
            rows = np.atleast_2d(np.asarray(table, float))
            by_f = [np.interp(f, self.prefix_f, r) for r in rows]
            return float(np.interp(d, self.prefix_d, by_f)) if self.prefix_d else float(by_f[0])
        return at(self.prefix_bias), at(self.prefix_sd)

    def to_dict(self) -> dict:
        return {"d": [float(x) for x in self.d], "curves": [[float(x) for x in c] for c in self.curves],
                "sources": list(self.sources), "seed_sd": self.seed_sd, "truth_sd": self.truth_sd,
                "sigma_sd": self.sigma_sd, "model": self.model, "mirrored": self.mirrored,
                "pilot_sigma_sd": self.pilot_sigma_sd, "prefix_f": list(self.prefix_f),
                "prefix_bias": _lists(self.prefix_bias), "prefix_sd": _lists(self.prefix_sd),
                "prefix_d": list(self.prefix_d), "shared_sd": self.shared_sd}

    @classmethod
    def from_dict(cls, d: dict) -> RhoErrors:
        return cls(np.asarray(d["d"], float), np.asarray(d["curves"], float), tuple(d["sources"]), float(d["seed_sd"]),
                   float(d["truth_sd"]), float(d["sigma_sd"]), str(d["model"]), bool(d["mirrored"]),
                   float(d.get("pilot_sigma_sd", 0.0)), tuple(d.get("prefix_f", ())), _tuples(d.get("prefix_bias", ())),
                   _tuples(d.get("prefix_sd", ())), tuple(d.get("prefix_d", ())), float(d.get("shared_sd", 0.0)))


def _lists(x):
    return [_lists(v) for v in x] if isinstance(x, (tuple, list)) else float(x)


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, (tuple, list)) else float(x)


def measured_errors(model: str = "noise-scale") -> RhoErrors:
    """The error curves of `model` measured on the recorded studies (`DATA`)."""
    if model not in DATA:
        raise RlsimError(f"no measured rho errors for the {model} model; rlsim plan knows {', '.join(DATA)}")
    return RhoErrors.from_dict(DATA[model])


# Written by `python -m bench.studies.plan_eval --write-errors`; do not edit by hand.
DATA: dict[str, dict] = {
    "noise-scale": {'d': [-2.0, -1.0, 0.0, 1.0, 2.0, 3.0],
     'sources': ['add2 seed0',
                 'add2 seed1',
                 'add2 seed2',
                 'add2 seed3',
                 'add2 seed4',
                 'add2 seed5',
                 'addmix seed0',
                 'addmix seed1',
                 'addmix seed2',
                 'addmix seed3',
                 'addmix seed4',
                 'addmix seed5',
                 'addmix lr 1e-4 seed0',
                 'addmix lr 1e-4 seed1',
                 'addmix lr 1e-4 seed2'],
     'seed_sd': 0.3786,
     'truth_sd': 0.1893,
     'sigma_sd': 0.1321,
     'model': 'noise-scale',
     'mirrored': True,
     'pilot_sigma_sd': 0.146,
     'prefix_f': [0.25, 0.5, 0.75, 1.0],
     'prefix_bias': [[0.1192, -0.0617, 0.0481, 0.1654],
                     [0.1252, 0.0945, -0.0743, -0.0503],
                     [0.2445, 0.1814, 0.1056, 0.0958],
                     [0.4618, 0.6993, 0.6174, 0.4041],
                     [1.406, 1.5447, 1.4026, 1.2578]],
     'prefix_sd': [[0.4872, 0.3607, 0.3775, 0.2574],
                   [0.7186, 0.596, 0.3912, 0.3536],
                   [0.7647, 0.6396, 0.4695, 0.4388],
                   [0.8022, 0.7556, 0.6373, 0.4978],
                   [1.668, 1.2064, 1.0582, 0.977]],
     'prefix_d': [-2.0, -1.0, 1.0, 2.0, 3.0],
     'shared_sd': 0.283,
     "curves": [
        [0.0887, 0.1048, 0.0, -0.4485, -0.4873, -0.6196],
        [-0.1922, -0.0374, 0.0, -0.2347, -0.1408, -0.1015],
        [0.0299, 0.0436, 0.0, -0.4346, -0.522, -0.6123],
        [0.0273, 0.05, 0.0, -0.4112, -0.3722, -0.426],
        [0.2315, 0.1863, 0.0, -0.3311, -0.4346, -0.5578],
        [0.1511, 0.1206, 0.0, -0.4714, -0.6001, -0.7191],
        [-0.5286, 0.0101, 0.0, 0.2191, 0.5328, 0.9466],
        [-0.2799, 0.1903, 0.0, 0.1756, 0.2643, 0.4175],
        [-0.3486, 0.0858, 0.0, 0.1402, -0.0057, 0.3122],
        [-0.5986, -0.0629, 0.0, 0.1657, 0.3046, 0.7542],
        [-0.4277, 0.1898, 0.0, 0.326, 0.4155, 0.687],
        [-0.6281, -0.122, 0.0, 0.1634, 0.339, 0.59],
        [-0.4602, -0.3609, 0.0, -0.0435, -0.1894, -0.2085],
        [-0.4267, -0.1735, 0.0, 0.1277, 0.272, 0.3743],
        [-0.3146, -0.2287, 0.0, 0.0073, 0.0898, 0.5352]]},
    "invariant": {'d': [-2.0, -1.0, 0.0, 1.0, 2.0, 3.0],
     'sources': ['add2 seed0',
                 'add2 seed1',
                 'add2 seed2',
                 'add2 seed3',
                 'add2 seed4',
                 'add2 seed5',
                 'addmix seed0',
                 'addmix seed1',
                 'addmix seed2',
                 'addmix seed3',
                 'addmix seed4',
                 'addmix seed5',
                 'addmix lr 1e-4 seed0',
                 'addmix lr 1e-4 seed1',
                 'addmix lr 1e-4 seed2'],
     'seed_sd': 0.3786,
     'truth_sd': 0.1893,
     'sigma_sd': 0.1321,
     'model': 'invariant',
     'mirrored': False,
     'pilot_sigma_sd': 0.146,
     'prefix_f': [0.25, 0.5, 0.75, 1.0],
     'prefix_bias': [[0.1192, -0.0617, 0.0481, 0.1654],
                     [0.1252, 0.0945, -0.0743, -0.0503],
                     [0.2445, 0.1814, 0.1056, 0.0958],
                     [0.4618, 0.6993, 0.6174, 0.4041],
                     [1.406, 1.5447, 1.4026, 1.2578]],
     'prefix_sd': [[0.4872, 0.3607, 0.3775, 0.2574],
                   [0.7186, 0.596, 0.3912, 0.3536],
                   [0.7647, 0.6396, 0.4695, 0.4388],
                   [0.8022, 0.7556, 0.6373, 0.4978],
                   [1.668, 1.2064, 1.0582, 0.977]],
     'prefix_d': [-2.0, -1.0, 1.0, 2.0, 3.0],
     'shared_sd': 0.283,
     "curves": [
        [-0.2837, -0.1275, 0.0, -0.1017, 0.3209, 0.742],
        [-0.3612, -0.1468, 0.0, -0.0463, 0.343, 0.7953],
        [-0.318, -0.1744, 0.0, -0.104, 0.2552, 0.7075],
        [-0.2525, -0.1276, 0.0, -0.1294, 0.3091, 0.7614],
        [-0.1563, -0.0549, 0.0, 0.0256, 0.3922, 0.8286],
        [-0.2673, -0.1381, 0.0, -0.0958, 0.2617, 0.7137],
        [-0.5813, -0.0247, 0.0, 0.2853, 0.7196, 1.3379],
        [-0.4922, 0.0539, 0.0, 0.4028, 0.8327, 1.4421],
        [-0.5636, -0.0523, 0.0, 0.3697, 0.5674, 1.3438],
        [-0.6866, -0.1206, 0.0, 0.2721, 0.5949, 1.3341],
        [-0.5553, 0.1067, 0.0, 0.4741, 0.8068, 1.4371],
        [-0.7407, -0.1957, 0.0, 0.2962, 0.6938, 1.28],
        [-0.5545, -0.4228, 0.0, 0.0698, 0.1181, 0.4012],
        [-0.4587, -0.1947, 0.0, 0.1688, 0.3906, 0.6318],
        [-0.3217, -0.2334, 0.0, 0.0167, 0.1176, 0.5989]]}}
