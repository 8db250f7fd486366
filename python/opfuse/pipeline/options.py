"""Typed pass options: an ``Options`` dataclass's fields, their pipeline-text spelling,
conversion of text and Python values to the field types, and help text."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import re
import types
import typing
from typing import Any, Union

from ..errors import OpfuseError
from .text import _split_top


# --- options --------------------------------------------------------------------------


def option_fields(options_cls: type) -> dict[str, Any]:
    """``{field name: resolved type}`` of an Options dataclass, in declaration order."""
    hints = typing.get_type_hints(options_cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(options_cls) if f.init}


def option_key(field_name: str) -> str:
    """The kebab-case spelling used in pipeline strings: ``r_limit`` -> ``r-limit``."""
    return field_name.replace("_", "-")


def describe_type(tp: Any) -> str:
    """A short name for an option type, for help and error messages."""
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "|".join(str(m.value) for m in tp)
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "|".join(str(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(describe_type(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"comma-separated {describe_type(typing.get_args(tp)[0])}s"
    if tp is type(None):
        return "none"
    return getattr(tp, "__name__", str(tp))


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1].replace("\\" + text[0], text[0])
    return text


def _convert(text: str, tp: Any) -> Any:
    """Convert an option's text to ``tp``; ValueError when it does not fit."""
    text = text.strip()
    origin = typing.get_origin(tp)
    if tp is Any or tp is str:
        return _unquote(text)
    if tp is bool:
        low = text.lower()
        if low in ("true", "1", "on", "yes"):
            return True
        if low in ("false", "0", "off", "no"):
            return False
        raise ValueError(text)
    if tp is int:
        return int(text, 0)
    if tp is float:
        return float(text)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if text in (str(member.value), member.name):
                return member
        raise ValueError(text)
    if origin is typing.Literal:
        for arg in typing.get_args(tp):
            if text == str(arg):
                return arg
        raise ValueError(text)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args and text.lower() in ("none", ""):
            return None
        for arg in args:
            if arg is not type(None):
                with contextlib.suppress(ValueError):
                    return _convert(text, arg)
        raise ValueError(text)
    if origin is tuple:
        args = typing.get_args(tp)
        items = [t for t in _unquote(text).split(",") if t.strip()] if text else []
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(t, args[0]) for t in items)
        if len(items) != len(args):
            raise ValueError(text)
        return tuple(_convert(t, a) for t, a in zip(items, args))
    raise ValueError(f"unsupported option type {tp}")


def _coerce(value: Any, tp: Any) -> Any:
    """A Python value for an option of type ``tp``: text is converted, numbers widened."""
    if isinstance(value, str) and tp is not str:
        return _convert(value, tp)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float) and isinstance(value, bool):
        raise ValueError(value)
    if typing.get_origin(tp) is tuple and isinstance(value, list):
        return tuple(value)
    if typing.get_origin(tp) is None and isinstance(tp, type) and not isinstance(value, tp):
        if issubclass(tp, enum.Enum):
            return _convert(str(value), tp)
        raise ValueError(value)
    return value


def format_value(value: Any) -> str:
    """An option value as pipeline text (the inverse of the parser)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return ",".join(format_value(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    if re.fullmatch(r"[\w.+\-/:]+", text):
        return text
    return '"' + text.replace('"', '\\"') + '"'


def make_options(
    pass_name: str, options_cls: type, values: dict[str, Any], *, text: bool = False
) -> Any:
    """An Options instance from ``{key: value}`` (keys kebab or snake case; values typed,
    or strings converted to the field's type; all pipeline text when ``text``). Unknown
    keys and bad values raise OpfuseError listing the valid options."""
    fields = option_fields(options_cls)
    kwargs = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in fields:
            raise OpfuseError(
                f"unknown option '{key}' for {pass_name}; valid options: "
                f"{describe_options(options_cls)}"
            )
        try:
            kwargs[name] = _convert(value, fields[name]) if text else _coerce(value, fields[name])
        except ValueError:
            raise OpfuseError(
                f"invalid value '{value}' for option '{option_key(name)}' of {pass_name}: "
                f"expected {describe_type(fields[name])}; valid options: "
                f"{describe_options(options_cls)}"
            ) from None
    try:
        return options_cls(**kwargs)
    except (TypeError, ValueError) as e:  # an Options.__post_init__ rejecting a value
        raise OpfuseError(f"invalid options for {pass_name}: {e}") from None


def describe_options(options_cls: type) -> str:
    """``delta=0.1 (float), r-limit=0 (int), ...``: every option with its default."""
    defaults = options_cls()
    return ", ".join(
        f"{option_key(name)}={format_value(getattr(defaults, name))} ({describe_type(tp)})"
        for name, tp in option_fields(options_cls).items()
    ) or "(none)"


def format_options(options: Any) -> str:
    """``{delta=0.2 r-limit=32}`` for the fields that differ from the defaults, or ``""``."""
    defaults = type(options)()
    parts = [
        f"{option_key(name)}={format_value(getattr(options, name))}"
        for name in option_fields(type(options))
        if getattr(options, name) != getattr(defaults, name)
    ]
    return "{" + " ".join(parts) + "}" if parts else ""


def parse_option_text(text: str) -> list[tuple[str, str | None]]:
    """Split ``delta=0.2 r-limit=32`` (or ``delta=0.2,r-limit=32``) into (key, value) pairs;
    a bare ``key`` has value None (a boolean switched on)."""
    pairs = []
    for token in _split_top(text, None):
        for part in re.split(r",(?=\s*[A-Za-z_][\w-]*\s*=)", token):
            if not part.strip():
                continue
            key, eq, value = part.partition("=")
            pairs.append((key.strip(), value if eq else None))
    return pairs


def _options_from_text(pass_name: str, options_cls: type, text: str) -> Any:
    values: dict[str, Any] = {}
    fields = option_fields(options_cls)
    for key, value in parse_option_text(text):
        if value is None:
            if fields.get(key.replace("-", "_")) is not bool:
                raise OpfuseError(
                    f"option '{key}' of {pass_name} needs a value (key=value); valid options: "
                    f"{describe_options(options_cls)}"
                )
            value = "true"
        values[key] = value
    return make_options(pass_name, options_cls, values, text=True)
