"""`rlsim rank`: T ratios from measurements teams made themselves.

CSV with a header, either `config,sigma,rho` (normalised by the reference row the user names, or relative to the
reference already when none is named) or `config,responses_per_s,samples_to_target` (absolute; the reference row
must be named). A named reference that is no row of the file is refused. T_new / T_ref = rho / sigma; sorted best first.
"""
from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from rlsim.replay.errors import RlsimError, did_you_mean, name, setting
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


def _reference_row(rows: list[tuple[str, float, float]], form: tuple[str, str], reference: str | None,
                   where: str) -> tuple[str, float, float] | None:
    """The reference's row; None when no reference is named and the measurements are relative already. A name that
    is no config of the measurements is refused (a typo would otherwise rank the real reference as a candidate)."""
    names = [r[0] for r in rows]
    shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    if reference is None:
        if form == ("sigma", "rho"):
            return None
        raise RlsimError(f"{where} holds absolute measurements ({', '.join(form)}): name the reference row with "
                         f"{name('reference')} (its configs: {shown})")
    ref = next((r for r in rows if r[0] == reference), None)
    if ref is None:
        raise RlsimError(f"{setting(reference=reference)} is not a config of {where}{did_you_mean(reference, names)}; "
                         f"its configs: {shown} (leave {name('reference')} out when sigma and rho are already "
                         "relative)")
    return ref


def rank(rows: list[tuple[str, float, float]], form: tuple[str, str], reference: str | None,
         where: str = "the measurements") -> list[Ranked]:
    """Rows ranked best first by T / T_ref = rho / sigma, relative to the `reference` row (None: as given)."""
    ref = _reference_row(rows, form, reference, where)
    s0, r0 = (ref[1], ref[2]) if ref else (1.0, 1.0)
    rel = [(n, a / s0, b / r0) for n, a, b in rows]
    ranked = [Ranked(n, s, r, r / s, "reference" if n == reference else regime(r / s)) for n, s, r in rel]
    return sorted(ranked, key=lambda x: (x.time_to_target_ratio, x.config))


def rank_file(path: str | os.PathLike, reference: str | None = None) -> tuple[list[Ranked], bool]:
    """(ranked rows, whether a reference row normalised them). `reference`: the config name of the reference row;
    None when sigma and rho are already relative to it (config,sigma,rho only)."""
    rows, form = read_measurements(path)
    return rank(rows, form, reference, str(path)), reference is not None
