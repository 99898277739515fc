"""The terminal ranking table of a sweep (rich)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from rlsim.replay.util import fmt

TERMINAL_COLUMNS = (("batch", "B", ""), ("responses_per_s", "resp/s", ".1f"), ("sigma", "sigma", ".3f"),
                    ("rho", "rho", ".3f"), ("time_to_target_ratio", "T ratio", ".3f"), ("regime", "regime", ""))


def ranking_table(rows: Sequence[Mapping[str, Any]], axes: Sequence[str], *, top: int = 10,
                  labels: Mapping[str, str] | None = None):
    """A rich table of the best `top` rows (rows already ranked): the axes that vary, then the key results."""
    from rich import box
    from rich.table import Table

    labels = labels or {}
    varying = [a for a in axes if len({repr(r.get(a)) for r in rows}) > 1] or list(axes)[:1]
    t = Table(title=f"Ranking by time to target, best {min(top, len(rows))} of {len(rows)} (all in results.csv)",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("#", justify="right", no_wrap=True)
    for a in varying:
        t.add_column(labels.get(a, a).lstrip("-"), justify="right", no_wrap=True)
    cols = [c for c in TERMINAL_COLUMNS if any(c[0] in r for r in rows)]
    for _, label, _ in cols:
        t.add_column(label, justify="right", no_wrap=True)
    for r in rows[:top]:
        t.add_row(str(r.get("rank", "")), *[fmt(r.get(a)) for a in varying],
                  *[fmt(_short_regime(r.get(k)) if k == "regime" else r.get(k), f) for k, _, f in cols])
    return t


def _short_regime(v: Any) -> Any:
    from rlsim.charts import regime_key

    return regime_key(v) or v

