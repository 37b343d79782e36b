"""Pure: what comes in over HTTP, checked before anything reads a field; JSON that goes out, always valid.

Every body the hub and the notebook server's GPU monitor accept (the job and
server REST bodies, the spawn form, the culler's usage report, the monitor's
notices) is read with :func:`read_json` (or given as JupyterHub parsed it) and
walked once by :func:`check_json` before any field is interpreted:

- the body is UTF-8 JSON of at most :data:`MAX_BODY` bytes, nested at most
  :data:`MAX_DEPTH` levels;
- every number is finite and at most :data:`MAX_NUMBER` in size (what a
  JavaScript number holds exactly): ``NaN``, ``Infinity`` and integers hundreds
  of digits long are refused;
- every text, keys included, is Unicode a database stores: no lone surrogate
  (``"\\ud800"``) and no NUL character.

A refusal is an :class:`OptionsError` that names the field (``time_limit``,
``parameters.alpha``, ``samples[3]``) and echoes at most :data:`MAX_SHOWN`
characters of what was sent (:func:`shown`, :func:`field_name`).

:func:`dumps` writes the JSON of the hub's answers: ``allow_nan=False``, and a
number that is not finite (a record written before these checks) is written as
``null``, so an answer is always JSON that a browser parses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_BODY", "MAX_DEPTH", "MAX_NUMBER", "MAX_SHOWN", "OptionsError", "check_json", "check_text",
           "dumps", "field_name", "read_json", "shown"]

#: the largest request body read, in bytes (a job request is well under 10 KiB)
MAX_BODY = 1 << 20
#: how deeply objects and arrays may nest in a body (the job body's deepest field is 2 levels down)
MAX_DEPTH = 8
#: the largest number, in size, a body may hold: 2**53, the integers a JavaScript number holds exactly
MAX_NUMBER = 2**53
#: the most characters of a user's input an error message repeats
MAX_SHOWN = 100
#: the most characters of a key that name a field in an error message
_MAX_FIELD = 40
#: the most characters of a nested field's path (``a.b.c``) in an error message
_MAX_PATH = 60


class OptionsError(ValueError):
    """A user choice, a request body or a profile definition that cannot be accepted; ``field`` names where."""

    def __init__(self, field: str, message: str) -> None:
        if len(field) > _MAX_PATH:  # a deep path of long keys: its start names where
            field = field[: _MAX_PATH - 3] + "..."
        super().__init__(f"{field}: {message}")
        self.field = field


def shown(value: Any, limit: int = MAX_SHOWN) -> str:
    """``value`` as an error message may repeat it: quoted, escaped, at most ``limit`` characters of it."""
    if isinstance(value, str):
        text = repr(value[:limit])
        if len(value) > limit or len(text) > limit + 2:  # long, or long once escaped
            return text[: limit + 1] + "..."
        return text
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() <= 64:
            return str(value)
        return f"a number of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    if isinstance(value, float):
        return repr(value)
    return f"a {type(value).__name__}"


def field_name(key: Any) -> str:
    """A key as the field an error names: at most 40 characters, anything unprintable escaped."""
    if not isinstance(key, str):
        return f"<{type(key).__name__} key>"
    if not key:
        return "''"
    text = key[:_MAX_FIELD]
    return text if text.isprintable() else repr(text)[1:-1][:_MAX_FIELD]


def check_text(text: str, field: str) -> None:
    """Refuse a text a database cannot store: a lone surrogate, or NUL."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise OptionsError(field, "is not valid Unicode text (it holds a lone surrogate such as \\ud800)") from None
    if "\0" in text:
        raise OptionsError(field, "must not contain the NUL character")


def _path(parent: str | None, key: Any) -> str:
    name = field_name(key)
    return name if parent is None else f"{parent}.{name}"


def check_json(value: Any, field: str | None = None, max_depth: int = MAX_DEPTH) -> None:
    """Walk a parsed body once (without recursion): finite, sized numbers, storable text, bounded nesting.

    ``field`` names ``value`` itself (``None`` for a whole body, whose keys then
    name the fields); :class:`OptionsError` names the first bad place.
    """
    stack: list[tuple[Any, str | None, int]] = [(value, field, 0)]
    while stack:
        item, where, depth = stack.pop()
        name = "body" if where is None else where
        if isinstance(item, bool) or item is None:
            continue
        if isinstance(item, str):
            check_text(item, name)
        elif isinstance(item, int):
            if abs(item) > MAX_NUMBER:
                raise OptionsError(name, f"{shown(item)} is too large a number (at most {MAX_NUMBER})")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise OptionsError(name, f"must be a finite number, not {item!r}")
            if abs(item) > MAX_NUMBER:
                raise OptionsError(name, f"{item:g} is too large a number (at most {MAX_NUMBER})")
        elif isinstance(item, Mapping):
            if depth >= max_depth:
                raise OptionsError(name, f"is nested more than {max_depth} levels deep")
            for key, child in item.items():
                if isinstance(key, str):
                    check_text(key, _path(where, key))
                stack.append((child, _path(where, key), depth + 1))
        elif isinstance(item, (list, tuple)):
            if depth >= max_depth:
                raise OptionsError(name, f"is nested more than {max_depth} levels deep")
            stack.extend((child, f"{name}[{n}]", depth + 1) for n, child in enumerate(item))
        else:
            raise OptionsError(name, f"must be JSON, not {type(item).__name__}")


def read_json(raw: bytes | str | None, max_depth: int = MAX_DEPTH) -> Any:
    """A request body as checked JSON (:func:`check_json`); ``None`` for an empty body."""
    if raw is None:
        return None
    if len(raw) > MAX_BODY:
        raise OptionsError("body", f"is larger than {MAX_BODY // 1024} KiB")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise OptionsError("body", "is not UTF-8 text") from None
    if not raw.strip():
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise OptionsError("body", f"is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise OptionsError("body", f"is nested more than {max_depth} levels deep") from None
    except ValueError:  # an integer of more digits than Python reads
        raise OptionsError("body", f"holds a number too large to read (at most {MAX_NUMBER})") from None
    check_json(value, None, max_depth)
    return value


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """JSON text of an answer, never ``NaN`` or ``Infinity``: a non-finite number is written as ``null``."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False)
