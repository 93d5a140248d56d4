"""Command-line options derived from the code they configure: a dataclass's fields or a
function's parameters give each option its type, default and choices, so the command line
cannot drift from the code (``python -m chexnet_utils train`` from ``TrainConfig``, the
``bench`` commands from their functions' signatures: :mod:`chexnet_utils.cli`).

:class:`Option` names an option's flag, help and placeholder; :func:`add_config_options` adds
the options to a parser; :func:`option_values` reads them back as keyword arguments.
"""

from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from chexnet_utils.platform.checks import literal_values


class Option(typing.NamedTuple):
    """The command-line option of a dataclass field (``train``: ``TrainConfig``) or of a
    function's parameter (the ``bench`` commands): its flag, help and placeholder."""

    flag: str
    help: str
    metavar: str | None = None


def option_type(hint: Any) -> Callable[[str], Any]:
    """What parses a command-line value of a field typed ``hint``: ``Path`` for paths,
    the values' type for a ``Literal``, the non-``None`` member of an optional type, a
    comma list for a sequence (:func:`comma_list_parser`)."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return type(typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        return Path if Path in members else option_type(members[0])
    if origin in (collections.abc.Sequence, list, tuple):
        return comma_list_parser(typing.get_args(hint)[0])
    return typing.cast(Callable[[str], Any], hint)


def comma_list_parser(item_hint: Any) -> Callable[[str], list[Any] | None]:
    """The parser of a comma list of ``item_hint`` values (``"1,2"`` -> ``[1, 2]``): each
    item checked against a ``Literal``'s values; blank text means the default (``None``)."""
    parse, allowed = option_type(item_hint), literal_values(item_hint)

    def comma_list(text: str) -> list[Any] | None:
        items = [parse(v.strip()) for v in text.split(",") if v.strip()]
        wrong = [v for v in items if allowed is not None and v not in allowed]
        if wrong:
            raise argparse.ArgumentTypeError(
                f"{', '.join(map(repr, wrong))} not one of {', '.join(map(repr, allowed or ()))}")
        return items or None

    return comma_list


def parameters(source: Callable[..., Any], names: Iterable[str]) -> dict[str, tuple[Any, Any]]:
    """Name -> (type, default) of the ``names`` among dataclass ``source``'s fields or
    function ``source``'s parameters (``dataclasses.MISSING``: no default). A function's
    annotations are resolved one by one in its module, only those asked for, and one that
    cannot be resolved is ``Any`` (a plain string option): the parser of every command is
    built from these, so nothing here may fail."""
    if isinstance(source, type) and dataclasses.is_dataclass(source):
        hints = typing.get_type_hints(source)
        found = {f.name: (hints[f.name], f.default) for f in dataclasses.fields(source)}
        return {name: found[name] for name in names}
    params = inspect.signature(source).parameters
    namespace = vars(inspect.getmodule(source))
    out: dict[str, tuple[Any, Any]] = {}
    for name in names:
        p = params[name]
        hint = p.annotation
        if isinstance(hint, str):
            try:
                hint = eval(hint, namespace)  # what typing.get_type_hints does
            except Exception:  # an annotation only type checkers can read
                hint = str
        default = dataclasses.MISSING if p.default is inspect.Parameter.empty else p.default
        out[name] = (hint, default)
    return out


def default_of(source: Callable[..., Any], name: str) -> Any:
    """The default of ``source``'s field or parameter ``name`` (for an option the command
    line spells in other units or words, such as ``--rate-gbit``)."""
    return parameters(source, [name])[name][1]


def flag_choices(hint: Any) -> tuple[Any, ...] | None:
    """argparse's ``choices`` for a field typed ``hint``: a ``Literal``'s values; none for a
    sequence (its comma list checks each item: :func:`comma_list_parser`)."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union,
                                                                   types.UnionType) else (hint,)
    if any(typing.get_origin(m) in (collections.abc.Sequence, list, tuple) for m in members):
        return None
    return literal_values(hint)


def shown_default(default: Any) -> str:
    """A default as a user types it (``[1, 2]`` -> ``1,2``)."""
    if isinstance(default, (list, tuple)):
        return ",".join(str(v) for v in default)
    return f"{default:g}" if isinstance(default, float) else str(default)


def add_config_options(parser: argparse.ArgumentParser, source: Callable[..., Any],
                       options: Mapping[str, Option],
                       required: Sequence[str] = ()) -> None:
    """Add an option per field of dataclass ``source`` (or parameter of function ``source``)
    named in ``options`` (name -> flag, help, placeholder), in that order: ``dest`` the name;
    type, default and choices (``Literal`` types) from the field, so the command line cannot
    drift from the code; a field without a default, or in ``required``, is required; a
    ``bool`` field (default ``False``) is a switch; a sequence is a comma list."""
    params = parameters(source, options)
    for name, (flag, help_text, metavar) in options.items():
        hint, default = params[name]
        if hint is bool:
            if default is not False:
                raise ValueError(f"{source.__name__}.{name}: a switch needs the default False")
            parser.add_argument(flag, dest=name, action="store_true", help=help_text)
            continue
        needed = default is dataclasses.MISSING or name in required
        shown = "" if needed or default is None else f" (default {shown_default(default)})"
        parser.add_argument(flag, dest=name, type=option_type(hint),
                            required=needed, choices=flag_choices(hint), metavar=metavar,
                            default=None if default is dataclasses.MISSING else default,
                            help=help_text + shown)


def option_values(args: argparse.Namespace, options: Mapping[str, Option]) -> dict[str, Any]:
    """The parsed values of ``options`` (added by :func:`add_config_options`), by name: the
    keyword arguments of the dataclass or function they came from. A value that is ``None``
    (a blank comma list, an option whose default is ``None``) is left out, so the function's
    own default applies."""
    values = {name: getattr(args, name) for name in options}
    return {name: v for name, v in values.items() if v is not None}
