"""One mechanism for the options of both CLIs, `rlsim` (rlsim.options) and `rlrun` (rlsim.runner.cli): each
option is a field of a config dataclass, its default and help stated once, on the field.

- `specs(cls)`: the fields as `Spec`s. A field's metadata holds its `help` and, where the option is not
  spelt `--field-name`, its `flags` (the first names the option in messages: `--batch`); `required` makes
  the CLI ask for a value the library defaults (rlrun's --out).
- `param(spec, prefix)`: the typer option. Values arrive as text and `value` parses them with the field's
  type (`rlsim.grid.parse_value`, or `parse_list` for a comma list), so a bad number is one line, e.g.
  `error: --prompts: 'x' is not a valid value (expected int)`, and exit 2 (with `cli_errors`), not
  click's usage box. Text fields (names, paths) are kept as typed; a bool is a flag pair
  (`--compile/--no-compile`), or the one flag its `flags` name (`--overwrite`); a tuple is a repeatable option.
- `generated(*groups)(fn)`: a typer command calling `fn(got_1, ..., **own)`: typer sees fn's own parameters
  plus every group's options; each group pops and parses its options from the call into what fn gets.

Only typer and rlsim.grid (no SimPy, numpy, torch): `rlrun --help` and its bad-input errors stay fast.
"""
from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable, Optional

import typer

from rlsim.grid import base_type, parse_list, parse_value, whatif_type_hints
from rlsim.replay.errors import RlsimError


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

    @property
    def label(self) -> str:
        """The option as messages and tables name it."""
        return self.flags[0]

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
                        pair="flags" not in f.metadata, required=bool(f.metadata.get("required"))))
    return out


def param(spec: Spec, prefix: str, *, as_list: bool = False, defaults: bool = False, help: str | None = None,
          metavar: str | None = None, panel: str | None = None) -> inspect.Parameter:
    """The typer option of `spec`, as a keyword parameter `prefix + field`. as_list: a comma list (a bool too).
    defaults: the option's default is the field's, shown in --help (else None: given or not)."""
    opt: dict[str, Any] = {"help": spec.help if help is None else help, "rich_help_panel": panel}
    decls = list(spec.flags)
    if spec.repeated:
        ann, default = typing.List[typing.get_args(spec.type)[0]], []
        opt["metavar"] = metavar
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
        named = spec.base.__name__ if spec.base in (int, float) else None
        opt["metavar"] = metavar or (f"<{named}>" if named else None)
    return inspect.Parameter(prefix + spec.field, inspect.Parameter.KEYWORD_ONLY, annotation=ann,
                             default=typer.Option(default, *decls, **opt))


def value(spec: Spec, raw: Any, *, as_list: bool = False) -> Any:
    """The typed value of what typer passed for `spec`: text parsed with the field's type (a list of values
    with as_list), text fields as typed, flags as given, repeated options as a tuple. RlsimError naming the option."""
    if isinstance(raw, list):
        return tuple(raw)
    if not isinstance(raw, str):
        return raw
    if as_list:
        return parse_list(raw, spec.type, spec.label)
    if spec.base is str:
        return raw  # names and paths as typed; the config's validate() checks choices
    if not raw.strip():
        raise RlsimError(f"{spec.label} is empty; give a value")
    return parse_value(raw, spec.type, spec.label)


def values(group: list[Spec], kw: dict[str, Any], prefix: str, *, as_list: bool = False) -> dict[str, Any]:
    """Pop the options of `group` from `kw`: field -> typed value, for those given (or defaulted)."""
    out = {}
    for s in group:
        raw = kw.pop(prefix + s.field, None)
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
    return Group([param(s, prefix, **style) for s in group],
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
