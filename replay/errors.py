"""One exception type for every user-facing failure: the CLIs print its message as one line and exit non-zero."""
import functools
import sys


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
