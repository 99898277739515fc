"""One mechanism for the options of both CLIs, `rlsim` (rlsim.cli.options) and `rlrun` (rlsim.runner.cli): each
option is a field of a config dataclass, its default and help stated once, on the field.

- `specs(cls)`: the fields as `Spec`s. A field's metadata holds its `help` and, where the option is not
  spelt `--field-name`, its `flags` (the first names the option in messages: `--batch`); `required` makes
  the CLI ask for a value the library defaults (rlrun's --out).
- `param(spec, prefix)`: the typer option. Values arrive as text and `value` parses them with the field's
  type (`rlsim.core.grid.parse_value`, or `parse_list` for a comma list), so a bad number is one line, e.g.
  `error: --prompts: 'x' is not a valid value (expected int)`, and exit 2 (with `cli_errors`), not
  click's usage box. Text fields (names, paths) are kept as typed; a bool is a flag pair
  (`--compile/--no-compile`), or the one flag its `flags` name (`--overwrite`); a tuple is a repeatable option.
- `generated(*groups)(fn)`: a typer command calling `fn(got_1, ..., **own)`: typer sees fn's own parameters
  plus every group's options; each group pops and parses its options from the call into what fn gets.
- `App`: the typer app of both CLIs. Its help reads one way everywhere: a value's placeholder is its type
  (`<int>`, `<float>`, `<str>`, `<path>`; a comma list `<int,...>`), as typer writes its own; a usage line
  names arguments `TRACE`, `[TRACE]` (optional) and `[TRACE]...` (repeatable); a default is `[default: X]`,
  typer's own or, for a default the library decides (a field's help ending in "(None: X)"), `default_text`'s.

Only typer and rlsim.core.grid (no SimPy, numpy, torch): `rlrun --help` and its bad-input errors stay fast.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.markup import escape
from typer.core import TyperArgument, TyperCommand

from rlsim.core.grid import base_type, parse_list, parse_value, whatif_type_hints
from rlsim.replay.errors import RlsimError

try:  # the click that typer raises from: its own copy in recent typer, the click package before
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - typer < 0.20
    from click import exceptions as click_errors


@dataclass(frozen=True)
class Spec:
    """One option, made from one dataclass field."""

    field: str
    flags: tuple[str, ...]
    type: Any
    default: Any
    help: str
    pair: bool = True  # a bool is `--x/--no-x` unless its metadata names its flags
    required: bool = False
    aliases: tuple[str, ...] = ()  # old spellings still accepted, not shown in --help

    @property
    def label(self) -> str:
        """The option as messages and tables name it."""
        return self.flags[0]

    @property
    def spellings(self) -> str:
        """Its long flags, as an error names it (the spelling typed is not known): `--prompts/--batch`."""
        return "/".join(f for f in self.flags if f.startswith("--")) or self.label

    @property
    def base(self) -> Any:
        return base_type(self.type)[0]

    @property
    def repeated(self) -> bool:
        return typing.get_origin(self.type) is tuple


def specs(cls: type, *, names: Any = None, spelling: dict | None = None, help: dict | None = None) -> list[Spec]:
    """The fields of dataclass `cls` (those in `names`, in field order) as options. `spelling` and `help`
    override a field's flags and help text for one command."""
    hints = whatif_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if names is not None and f.name not in names:
            continue
        flags = (spelling or {}).get(f.name) or f.metadata.get("flags") or ["--" + f.name.replace("_", "-")]
        out.append(Spec(f.name, tuple(flags), hints.get(f.name, f.type), f.default,
                        str((help or {}).get(f.name, f.metadata.get("help", ""))),
                        pair="flags" not in f.metadata, required=bool(f.metadata.get("required")),
                        aliases=tuple(f.metadata.get("aliases", ()))))
    return out


UNSET = re.compile(r"\s*\(None: (.*)\)(\.?)$")  # a field's help ends "(None: what an unset value means)"


def split_default(help: str) -> tuple[str, str | None]:
    """('P: prompts per update', "the trace's") from "P: prompts per update (None: the trace's)"; (help, None)
    where the help states no such default."""
    m = UNSET.search(help)
    return (help[:m.start()] + m.group(2), m.group(1)) if m else (help, None)


def default_text(help: str, shown: str) -> str:
    """The help with its default as typer writes its own: 'help [default: shown]' (escaped: not rich markup)."""
    return f"{help} {escape(f'[default: {shown}]')}"


def placeholder(tp: Any, as_list: bool = False) -> str | None:
    """The value's placeholder in --help, as typer writes its own: `<int>`, `<float>`, `<str>`, `<path>`; a comma
    list `<int,...>`; None for a flag (no value)."""
    base = base_type(tp)[0]
    if typing.get_origin(base) is typing.Literal:
        name = "|".join(map(str, typing.get_args(base)))
    else:
        name = "path" if base is Path else getattr(base, "__name__", "str")
    if base is bool and not as_list:
        return None
    return f"<{name},...>" if as_list else f"<{name}>"


def _shown_default(spec: Spec, as_list: bool) -> str | None:
    """The field's default as --help names it (None: none to show: missing, empty, a flag that is off)."""
    v = spec.default
    if v in (None, dataclasses.MISSING, ()) or (spec.base is bool and not spec.pair and not as_list):
        return None
    if spec.base is bool:
        return str(v).lower() if as_list else ("" if v else "no-") + spec.label[2:]
    return str(v)


def param(spec: Spec, prefix: str, *, as_list: bool = False, defaults: bool = False, help: str | None = None,
          metavar: str | None = None, panel: str | None = None) -> inspect.Parameter:
    """The typer option of `spec`, as a keyword parameter `prefix + field`. as_list: a comma list (a bool too).
    defaults: the option's default is the field's, which typer shows in --help (else None: given or not, and the
    help states the default itself). A help ending in "(None: X)" shows X as the default. metavar: the placeholder
    of an option whose text another parser reads (else `placeholder`'s)."""
    text, unset = split_default(spec.help if help is None else help)
    shown_by_typer = defaults and spec.default not in (None, dataclasses.MISSING)
    shown = unset or (None if shown_by_typer or spec.required else _shown_default(spec, as_list))
    opt: dict[str, Any] = {"help": default_text(text, shown) if shown else text, "rich_help_panel": panel,
                           "metavar": metavar or placeholder(spec.type, as_list)}
    decls = list(spec.flags)
    if spec.repeated:
        ann, default = typing.List[typing.get_args(spec.type)[0]], []
        opt["metavar"] = metavar or placeholder(typing.get_args(spec.type)[0])
    elif spec.base is bool and not as_list:
        if spec.pair:
            decls = [f"{spec.label}/--no-{spec.label[2:]}"]
        if defaults or not spec.pair:
            ann, default = bool, bool(spec.default)
        else:
            ann, default = Optional[bool], None
    else:
        ann = str if spec.required else Optional[str]
        if spec.required:
            default = ...
        elif defaults and spec.default not in (None, dataclasses.MISSING):
            default = str(spec.default)  # shown as [default: ...] and parsed back like a given value
        else:
            default = None
    return inspect.Parameter(prefix + spec.field, inspect.Parameter.KEYWORD_ONLY, annotation=ann,
                             default=typer.Option(default, *decls, **opt))


ALIAS = "__alias"  # the parameter of a spec's hidden old spellings: prefix + field + ALIAS


def alias_param(spec: Spec, prefix: str) -> inspect.Parameter:
    """A hidden option taking `spec`'s old spellings (`aliases`) as text; `values` reads it where the option itself
    was not given."""
    return inspect.Parameter(prefix + spec.field + ALIAS, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                             default=typer.Option(None, *spec.aliases, hidden=True))


def given(spec: Spec, kw: dict[str, Any], prefix: str) -> Any:
    """Pop what the call gave for `spec` from `kw`: an old spelling where one was typed (the option itself may
    hold only its shown default), else the option's value; None if nothing."""
    raw = kw.pop(prefix + spec.field, None)
    old = kw.pop(prefix + spec.field + ALIAS, None)
    return old if old is not None else raw


def value(spec: Spec, raw: Any, *, as_list: bool = False) -> Any:
    """The typed value of what typer passed for `spec`: text parsed with the field's type (a list of values
    with as_list), text fields as typed, flags as given, repeated options as a tuple. RlsimError naming the option."""
    if isinstance(raw, list):
        return tuple(raw)
    if not isinstance(raw, str):
        return raw
    if as_list:
        return parse_list(raw, spec.type, spec.spellings)
    if spec.base is str:
        return raw  # names and paths as typed; the config's validate() checks choices
    if not raw.strip():
        raise RlsimError(f"{spec.spellings} is empty; give a value")
    return parse_value(raw, spec.type, spec.spellings)


def values(group: list[Spec], kw: dict[str, Any], prefix: str, *, as_list: bool = False) -> dict[str, Any]:
    """Pop the options of `group` from `kw`: field -> typed value, for those given (or defaulted)."""
    out = {}
    for s in group:
        raw = given(s, kw, prefix)
        if raw is not None:
            out[s.field] = value(s, raw, as_list=as_list)
    return out


@dataclass(frozen=True)
class Group:
    """Generated options and how a call's values become what the command function receives."""

    params: list
    collect: Callable[[dict], Any]


def options(group: list[Spec], prefix: str, **style: Any) -> Group:
    """The options of `group` (styled as `param` takes them); the function gets a dict field -> value."""
    return Group([param(s, prefix, **style) for s in group] + [alias_param(s, prefix) for s in group if s.aliases],
                 lambda kw: values(group, kw, prefix, as_list=style.get("as_list", False)))


def generated(*groups: Group) -> Callable:
    """Decorator: `fn(got_1, ..., got_n, **own)` -> a function typer registers, whose parameters are fn's own
    (after the first n) followed by every group's options."""
    def deco(fn: Callable) -> Callable:
        try:
            hints = typing.get_type_hints(fn)  # fn's own annotations, resolved where fn was written
        except Exception:  # unresolvable: typer gets them as written
            hints = {}
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
               for p in list(inspect.signature(fn).parameters.values())[len(groups):]]
        params = own + [p for g in groups for p in g.params]

        def command(**kw: Any) -> Any:
            got = [g.collect(kw) for g in groups]  # pops the generated options: kw keeps fn's own
            return fn(*got, **kw)

        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        command.__doc__ = fn.__doc__
        command.__name__ = fn.__name__
        return command

    return deco


class Command(TyperCommand):
    """A command whose usage line names its arguments as its help does: TRACE (required), [TRACE] (optional),
    [TRACE]... (repeatable), where typer writes {trace} and [[TRACE]]."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for p in self.params:
            if isinstance(p, TyperArgument):
                p.metavar = (p.metavar or p.name or "").strip("[]").upper()

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        out = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if isinstance(p, TyperArgument):
                out.append((p.metavar if p.required else f"[{p.metavar}]") + ("..." if p.nargs != 1 else ""))
            else:
                out.extend(p.get_usage_pieces(ctx))
        return out


class App(typer.Typer):
    """The typer app of `rlsim` and `rlrun` (and their command groups): every command a `Command`, help text
    read as rich markup (so an escaped `[default: X]` prints as typer prints its own)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{"rich_markup_mode": "rich", **kwargs})

    def command(self, *args: Any, cls: Any = None, **kwargs: Any) -> Callable:
        return super().command(*args, cls=cls or Command, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the CLI as a program: a usage error (an unknown option, a missing value) is one `error:` line naming
        the help to read, and exit code 2, as every other bad input; help prints as typer prints it."""
        if not kwargs.setdefault("standalone_mode", True):
            return super().__call__(*args, **kwargs)
        try:
            code = super().__call__(*args, **{**kwargs, "standalone_mode": False})
        except getattr(click_errors, "NoArgsIsHelpError", ()) as e:
            e.show()
            raise SystemExit(e.exit_code) from None
        except click_errors.UsageError as e:
            where = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
            print(f"error: {e.format_message().rstrip('.')}{where}", file=sys.stderr)
            raise SystemExit(e.exit_code) from None
        except click_errors.ClickException as e:
            print(f"error: {e.format_message()}", file=sys.stderr)
            raise SystemExit(e.exit_code) from None
        except typer.Abort:
            print("aborted", file=sys.stderr)
            raise SystemExit(1) from None
        raise SystemExit(code if isinstance(code, int) else 0)
