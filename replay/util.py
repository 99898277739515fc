"""Small helpers every layer shares, one copy each: JSON-safe values and strict JSON text, number
formatting, atomic file writes, an exclusive lock on an output path, and the cores this process may use.

Strict JSON means what jq, JavaScript and Go accept: no NaN or Infinity. A value that does not exist
(a time-to-target never reached, an undefined ratio) is written as null; the reason goes in a field or
a warning beside it, never in the number.
"""
from __future__ import annotations

import dataclasses
import enum
import errno
import fcntl
import json
import math
import os
from contextlib import contextmanager
from numbers import Integral
from pathlib import Path
from typing import Any, Iterator

from rlsim.replay.errors import RlsimError


def json_safe(v: Any) -> Any:
    """A value made of dict/list/str/int/float/bool/None only: numpy scalars and arrays become Python
    numbers and lists, non-finite floats None, enums their value, dataclasses dicts, paths and other
    objects their text."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, int):
        return v
    if isinstance(v, enum.Enum):
        return json_safe(v.value)
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [json_safe(x) for x in v]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: json_safe(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if hasattr(v, "tolist"):  # numpy scalars and arrays
        return json_safe(v.tolist())
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    return str(v)


def dumps(obj: Any, *, indent: int | None = None, compact: bool = False) -> str:
    """Strict JSON text of `obj` after `json_safe` (raises ValueError if a NaN slipped through)."""
    sep = (",", ":") if compact else None
    return json.dumps(json_safe(obj), indent=indent, separators=sep, allow_nan=False)


def fmt(v: Any, kind: str = "") -> str:
    """A value for a terminal or HTML table: '-' where it does not exist; kind 's' (seconds, hours past
    an hour), 'x' (a ratio), '%' (a fraction shown as percent), another format spec (".3f"), else 4
    significant digits."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
        return str(v)
    if kind == "s":
        v = float(v)
        return f"{v:.4g} s" if v < 3600 else f"{v / 3600:.3g} h"
    if kind == "x":
        return f"{float(v):.3f}x"
    if kind == "%":
        return f"{100 * float(v):.1f}%"
    if kind:
        return format(float(v), kind)
    if isinstance(v, int):
        return str(v)
    return f"{float(v):.4g}"


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` to `path` through a temporary file and a rename: a reader never sees half a file,
    and a failure leaves the old file as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, str):
            tmp.write_text(data)
        else:
            tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def lock_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p.with_name(f".{p.name}.lock")


@contextmanager
def exclusive(path: str | os.PathLike, *, what: str = "output") -> Iterator[None]:
    """Hold an exclusive, non-blocking lock on `path` (a file or folder, locked through a hidden
    `.<name>.lock` beside it) for the duration of the block. A second holder fails at once with one
    line instead of interleaving its writes with the first. The lock dies with its process (flock), so
    a killed run never leaves a stale lock behind; the lock file itself is left in place (removing it
    would let a third process lock a different inode)."""
    lp = lock_path(path)
    lp.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lp, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RlsimError(f"{path} is in use by another rlsim process (lock {lp}); wait for it to finish "
                                 f"or choose another {what}") from None
            raise
        yield
    finally:
        os.close(fd)


# Defaults used wherever a trace or a config leaves a value out, in one place.
# vLLM's own defaults for the engine limits; block size and model length as vLLM's defaults.
ENGINE_DEFAULTS = {"max_num_seqs": 256, "kv_cache_tokens": 65536, "block_size": 16, "max_model_len": 4096}


def is_count(v: Any, least: int) -> bool:
    """Whether v is an integer (not a bool) of at least `least`."""
    return isinstance(v, Integral) and not isinstance(v, bool) and v >= least


def default_group(algo: str | None) -> int:
    """G when a config does not say: 1 for PPO (a value model, no groups), 8 for GRPO (the article's G)."""
    return 1 if algo == "ppo" else 8


def cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS reports one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)
