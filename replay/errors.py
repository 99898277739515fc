"""One exception type for every user-facing failure: the CLIs print its message as one line and exit non-zero."""


class RlsimError(Exception):
    """Bad input or an impossible request. The message says what is wrong and how to fix it."""


class TraceError(RlsimError):
    """A trace file is missing, unreadable, of another schema version, or lacks columns."""


def cli_errors(fn):
    """Decorate a typer command: an RlsimError becomes one line on stderr and exit code 2, no traceback."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        import typer

        try:
            return fn(*args, **kwargs)
        except RlsimError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None

    return wrapper
