"""The sweep grid: comma lists (`--prompts 64,128 --group 4,8 --lr-rule sqrt,fixed`) parsed by the
field types of `WhatIf` into validated configs, in a fixed order (the order of the axes, then of the
values; the last axis varies fastest)."""
from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import types
import typing
from typing import Any, Mapping, Sequence

from rlsim.replay.errors import RlsimError


def base_type(tp: Any) -> tuple[Any, bool]:
    """(underlying type, accepts None) of a field annotation like `int`, `float | None`, `Literal[...]`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        return (args[0] if len(args) == 1 else str), optional
    return tp, False


def parse_value(text: str, tp: Any, option: str) -> Any:
    """One list element converted to the field's type; RlsimError naming the option otherwise."""
    base, optional = base_type(tp)
    s = text.strip()
    if s == "":
        raise RlsimError(f"{option}: empty element in the list (write values separated by single commas, e.g. {option} "
                         "64,128)")
    if optional and s.lower() in ("none", "null", "-"):
        return None
    try:
        if typing.get_origin(base) is typing.Literal:
            choices = typing.get_args(base)
            for c in choices:
                if str(c) == s:
                    return c
            raise ValueError(f"expected one of {', '.join(map(str, choices))}")
        if isinstance(base, type) and issubclass(base, enum.Enum):
            try:
                return base(s)
            except ValueError:
                return base[s]
        if base is bool:
            if s.lower() in ("1", "true", "yes", "on"):
                return True
            if s.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError("expected true or false")
        if base is int:
            f = float(s)
            if not f.is_integer():
                raise ValueError("expected an integer")
            return int(f)
        if base is float:
            v = float(s)
            if math.isnan(v):
                raise ValueError("NaN is not a value")
            return v
        return s
    except (ValueError, KeyError) as e:
        why = str(e) if str(e) and "could not convert" not in str(e) and "invalid literal" not in str(e) else \
            f"expected {getattr(base, '__name__', base)}"
        raise RlsimError(f"{option}: {s!r} is not a valid value ({why})") from None


def parse_list(text: str, tp: Any, option: str) -> list:
    """`"64,128,256"` -> [64, 128, 256]; duplicates removed (first kept)."""
    if text is None or not str(text).strip():
        raise RlsimError(f"{option}: empty list; give at least one value")
    out: list = []
    for part in str(text).split(","):
        v = parse_value(part, tp, option)
        if v not in out:
            out.append(v)
    return out


def whatif_type_hints(whatif_cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(whatif_cls)
    except Exception:  # unresolvable annotation: fall back to the raw ones
        return {f.name: f.type for f in dataclasses.fields(whatif_cls)}


def build_grid(whatif_cls: type, axes: Mapping[str, Sequence[Any]], fixed: Mapping[str, Any] | None = None,
               *, labels: Mapping[str, str] | None = None) -> list:
    """The cartesian product of `axes` (field -> values) over `fixed` fields, as validated WhatIf configs.
    The last axis varies fastest. RlsimError for an empty grid or an invalid config (naming it)."""
    labels = labels or {}
    fixed = dict(fixed or {})
    for name, values in axes.items():
        if len(values) == 0:
            raise RlsimError(f"{labels.get(name, name)}: empty list; the grid would have no configs")
    names = list(axes)
    combos = list(itertools.product(*(axes[n] for n in names)))
    if not combos:
        raise RlsimError("the sweep grid is empty: give at least one value for each swept option")
    grid = []
    for combo in combos:
        kwargs = {**fixed, **dict(zip(names, combo))}
        try:
            cfg = whatif_cls(**kwargs)
            validate = getattr(cfg, "validate", None)
            if validate is not None:
                validate()
        except RlsimError as e:
            desc = " ".join(f"{labels.get(n, n)} {v}" for n, v in zip(names, combo))
            raise RlsimError(f"config [{desc}] is invalid: {e}") from None
        except (TypeError, ValueError) as e:
            raise RlsimError(f"invalid sweep values: {e}") from None
        grid.append(cfg)
    return grid


def config_dict(cfg: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(cfg):
        return {f.name: plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    return dict(vars(cfg))


def plain(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, tuple):
        return list(v)
    return v
