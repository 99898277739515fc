"""`rlsim rank`: T ratios from measurements teams made themselves.

CSV with a header, either `config,sigma,rho` (relative to the reference already, or normalised by the
reference row when present) or `config,responses_per_s,samples_to_target` (absolute; the reference row
must be present). T_new / T_ref = rho / sigma; sorted best first.
"""
from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from rlsim.replay.errors import RlsimError
from rlsim.replay.rho import regime

FORMS = (("sigma", "rho"), ("responses_per_s", "samples_to_target"))


@dataclass(frozen=True)
class Ranked:
    """One ranked configuration."""

    config: str = field(metadata={"help": "configuration name from the CSV"})
    sigma: float = field(metadata={"help": "throughput gain vs the reference"})
    rho: float = field(metadata={"help": "sample cost vs the reference"})
    time_to_target_ratio: float = field(metadata={"help": "rho / sigma"})
    regime: str = field(metadata={"help": "time falls | flat | time rises | reference (the reference row)"})

    def to_dict(self) -> dict:
        return {"config": self.config, "sigma": self.sigma, "rho": self.rho,
                "time_to_target_ratio": self.time_to_target_ratio, "regime": self.regime}


def _num(path: Path, line: int, col: str, raw: str) -> float:
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise RlsimError(f"{path}:{line}: column {col} is {raw!r}, not a number") from None
    if not (v > 0 and math.isfinite(v)):
        raise RlsimError(f"{path}:{line}: column {col} must be a positive number, got {raw!r}")
    return v


def read_measurements(path: str | os.PathLike) -> tuple[list[tuple[str, float, float]], tuple[str, str]]:
    """Rows (config, a, b) and the form: ('sigma','rho') or ('responses_per_s','samples_to_target')."""
    path = Path(path)
    if not path.is_file():
        raise RlsimError(f"measurements file not found: {path}")
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            header = [h.strip() for h in (reader.fieldnames or [])]
            raw_rows = list(reader)
    except (UnicodeDecodeError, csv.Error) as e:
        raise RlsimError(f"{path} is not a readable CSV file ({type(e).__name__})") from None
    form = next((f for f in FORMS if "config" in header and all(c in header for c in f)), None)
    if form is None:
        raise RlsimError(f"{path} has columns {','.join(header) or '(none)'}; expected config,sigma,rho or "
                         "config,responses_per_s,samples_to_target")
    rows = []
    seen = set()
    for i, r in enumerate(raw_rows, start=2):
        r = {(k or "").strip(): (v or "").strip() for k, v in r.items()}
        name = r.get("config", "")
        if not name:
            raise RlsimError(f"{path}:{i}: empty config name")
        if name in seen:
            raise RlsimError(f"{path}:{i}: config {name!r} appears twice")
        seen.add(name)
        rows.append((name, _num(path, i, form[0], r.get(form[0])), _num(path, i, form[1], r.get(form[1]))))
    if not rows:
        raise RlsimError(f"{path} has no data rows")
    return rows, form


def rank(rows: list[tuple[str, float, float]], form: tuple[str, str], reference: str) -> list[Ranked]:
    names = [r[0] for r in rows]
    ref = next((r for r in rows if r[0] == reference), None)
    if form == ("sigma", "rho"):
        s0, r0 = (ref[1], ref[2]) if ref else (1.0, 1.0)
        out = [(n, s / s0, rho / r0) for n, s, rho in rows]
    else:
        if ref is None:
            raise RlsimError(f"reference {reference!r} is not a config in the measurements ({', '.join(names)}); pass --reference with one of them")
        out = [(n, q / ref[1], nstar / ref[2]) for n, q, nstar in rows]
    ranked = [Ranked(n, s, r, r / s, regime(r / s)) for n, s, r in out]
    if ref is not None:
        ranked = [x if x.config != reference else Ranked(x.config, x.sigma, x.rho, x.time_to_target_ratio, "reference") for x in ranked]
    return sorted(ranked, key=lambda x: (x.time_to_target_ratio, x.config))


def rank_file(path: str | os.PathLike, reference: str) -> tuple[list[Ranked], bool]:
    """(ranked rows, whether the reference row was present)."""
    rows, form = read_measurements(path)
    present = any(r[0] == reference for r in rows)
    return rank(rows, form, reference), present
