"""One exception type for every user-facing failure: the CLIs print its message as one line and exit non-zero.

Messages name a setting the way the caller sets it (`name`, `setting`): the CLI's option (`--prompts`, `--rho`) by
default, or the notebook API's keyword (`prompts`, `rho`) inside `keyword_names()`, which rlsim.api enters.
`did_you_mean` is the one suggestion for a misspelt keyword or label.
"""
import difflib
import functools
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterable, Iterator


class RlsimError(Exception):
    """Bad input or an impossible request. The message says what is wrong and how to fix it."""


class TraceError(RlsimError):
    """A trace file is missing, unreadable, of another schema version, or lacks columns."""


def cli_errors(fn):
    """Wrap a command-line entry point: an RlsimError becomes one line on stderr and exit code 2, no
    traceback. Plain Python (SystemExit), so both CLIs use it without the trace layer knowing typer."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RlsimError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper


_KEYWORDS: ContextVar[bool] = ContextVar("rlsim_keyword_names", default=False)
# Where a library name is not the option's `--field-name` or the API's keyword: the sample-cost model is --rho and
# rho=; in the API, traces are the first argument of fit and sweep.
OPTION_SPELLING = {"rho_model": "--rho"}
KEYWORD_NAMES = {"rho_model": "rho"}
KEYWORD_SPELLING = {"trace": "traces=[...]", **KEYWORD_NAMES}


def name(field_name: str) -> str:
    """`--gen-gpus` in the CLI, `gen_gpus` in the notebook API."""
    if _KEYWORDS.get():
        return KEYWORD_SPELLING.get(field_name, field_name)
    return OPTION_SPELLING.get(field_name, "--" + field_name.replace("_", "-"))


def setting(**values) -> str:
    """`--gen-gpus 6 --train-gpus 2 --partial-rollout` in the CLI, `gen_gpus=6, train_gpus=2, partial_rollout=True`
    in the notebook API (a true flag is its option alone)."""
    shown = {k: f"{v:g}" if isinstance(v, float) else v for k, v in values.items()}  # 2.0 as the user typed it: 2
    if _KEYWORDS.get():
        return ", ".join(f"{KEYWORD_NAMES.get(k, k)}={v}" for k, v in shown.items())
    return " ".join(name(k) if v is True else f"{name(k)} {v}" for k, v in shown.items())


@contextmanager
def keyword_names() -> Iterator[None]:
    """Within: RlsimErrors name the keyword (`prompts`) instead of the option (`--prompts`)."""
    token = _KEYWORDS.set(True)
    try:
        yield
    finally:
        _KEYWORDS.reset(token)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest of `choices` to `word`, or ''. Also matches a CLI option's name given as
    a keyword (`rho` for `rho_model`, whose option is --rho) and a word that is one part of a choice (`gpus`)."""
    choices = [str(c) for c in choices]
    word = str(word)
    key = word.lstrip("-").replace("-", "_")  # an option's name as a keyword: --rho -> rho
    by_option = [c for c in choices if OPTION_SPELLING.get(c, "").lstrip("-").replace("-", "_") == key]
    close = difflib.get_close_matches(word, choices, n=1)
    part = [c for c in choices if key and key in c.split("_")]
    best = (by_option or close or part or [None])[0]
    return f" (did you mean {best}?)" if best is not None and best != word else ""
