"""The checks every write path runs on what it is handed, in one place.
Imports only `cleanup.conf` (the limits on a run), so that every door may import it.

The API, the admin and the commands all store what a person or a console sends: a run's
name and steps, a lease's target, a waiver's reason. Whatever the door, the value is
checked here before anything reaches the database, and a refusal names the field it is
about (``steps[3].params.x``), so that PostgreSQL never sees a NUL, a lone surrogate or
an infinity, and nothing unbounded is stored.

What a person writes is also clean text (`clean_text_problem`): no control character
(C0 but tab, DEL, C1) and no bidirectional control (embeddings, overrides, isolates, the
direction marks), since a CR/LF in a run's name would break its alert mails' subject, and
a right-to-left override in a reason would make a line read as something it is not. The
engine checks names, reasons, actors and every string of a step's params (`text_error`,
`json_problem(clean=True)`, `check_actor`), so every door (API, admin, commands) refuses
them with the field named. Text stored before this, and what modules answer, is shown
through `one_line`, which writes such characters as escapes.

`json_problem` walks a JSON value without recursion, so a body nested ten thousand levels
deep is refused like one nested thirty-three, instead of exhausting the stack.
May import: conf only.
"""

import json
import math
from collections.abc import Mapping
from typing import Any, NoReturn

from .conf import setting

MAX_DEPTH = 32
# A whole number past 64 bits is refused: PostgreSQL's jsonb would keep it, but Python
# cannot print one past 4,300 digits, and no backend wants one.
MAX_INT = 2**63 - 1
MAX_NAME = 200
MAX_ACTION = 200
MAX_TARGET = 200
MAX_REASON = 1000
MAX_ACTOR = 150


class Invalid(ValueError):
    """Values that cannot be stored. ``errors`` maps each field to what is wrong with it."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{field}: {message}" for field, message in self.errors.items()))


def limit(name: str) -> int:
    """A limit on what one run may hold (``EVENT_MAX_STEPS``, ``EVENT_MAX_PARAMS_BYTES``), read now."""
    value: int = setting(name)
    return value


def field_path(parent: str, key: str | int) -> str:
    """``parent.key`` for a plain key, ``parent[3]`` for an index, ``parent["a b"]`` otherwise."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if key.isidentifier() and key.isascii():
        return f"{parent}.{key}" if parent else key
    # json.dumps escapes what a message cannot carry (a NUL, a lone surrogate).
    return f"{parent}[{json.dumps(key)}]"


# C0 controls but tab, DEL and the C1 controls.
CONTROLS = frozenset(chr(c) for c in (*range(0x00, 0x09), *range(0x0A, 0x20), *range(0x7F, 0xA0)))
# The bidirectional controls: the marks (LRM, RLM, ALM), embeddings and overrides, isolates.
BIDI = frozenset(chr(c) for c in (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)))
_ESCAPES = {"\n": "\\n", "\r": "\\r"}


def clean_text_problem(value: str) -> str | None:
    """What is wrong with a string a person wrote (a name, a reason, a param), or None.

    As `text_problem`, and no control character but tab and no bidirectional control.
    """
    problem = text_problem(value)
    if problem:
        return problem
    for index, char in enumerate(value):
        if char in CONTROLS:
            return f"may not contain a control character (U+{ord(char):04X} at {index})"
        if char in BIDI:
            return f"may not contain a bidirectional control (U+{ord(char):04X} at {index})"
    return None


def check_actor(actor: object, field: str = "actor") -> Any:
    """Refuse an actor (who did it, as recorded) that is not clean text; ``None`` passes."""
    if actor is None:
        return actor
    problem = clean_text_problem(str(actor))
    if problem:
        raise Invalid({field: problem})
    if len(str(actor)) > MAX_ACTOR:
        raise Invalid({field: f"has at most {MAX_ACTOR} characters, got {len(str(actor))}"})
    return actor


def one_line(value: object) -> str:
    """``value`` as text on one line: every control and bidirectional character written as an
    escape (``\\n``, ``\\u202e``), so that stored text can add no line or header to a mail or a
    message, and not read as something it is not."""
    text = "" if value is None else str(value)
    if not any(char in CONTROLS or char in BIDI for char in text):
        return text
    return "".join(
        _ESCAPES.get(char, f"\\u{ord(char):04x}") if char in CONTROLS or char in BIDI else char for char in text
    )


def text_problem(value: str) -> str | None:
    """What is wrong with a string as stored text, or None."""
    if "\x00" in value:
        return "may not contain a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    return None


def json_problem(
    value: object, where: str = "", max_depth: int = MAX_DEPTH, *, clean: bool = False
) -> tuple[str, str] | None:
    """The first ``(field, message)`` that keeps ``value`` from being stored as JSON, or None.

    Objects and arrays may nest ``max_depth`` levels; numbers are finite, whole numbers
    fit in 64 bits; strings and keys are valid Unicode without NUL, and with ``clean``
    (what a person wrote: a step's params) clean text (`clean_text_problem`).
    """
    check = clean_text_problem if clean else text_problem
    pending: list[tuple[object, str, int]] = [(value, where, 0)]
    while pending:
        item, path, depth = pending.pop()
        problem = check(item) if isinstance(item, str) else _scalar_problem(item)
        if problem:
            return path or "body", problem
        if isinstance(item, dict | list):
            if depth >= max_depth:
                return path or "body", f"nests deeper than {max_depth} levels"
            children: Any = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in children:
                if isinstance(item, dict):
                    if not isinstance(key, str):
                        return path or "body", "object keys must be strings"
                    key_problem = check(key)
                    if key_problem:
                        return field_path(path, key), f"its name {key_problem}"
                pending.append((child, field_path(path, key), depth + 1))
    return None


def _scalar_problem(item: object) -> str | None:
    if item is None or isinstance(item, bool | dict | list):
        return None
    if isinstance(item, str):
        return text_problem(item)
    if isinstance(item, int):
        return None if -MAX_INT <= item <= MAX_INT else "is a whole number larger than 64 bits"
    if isinstance(item, float):
        return None if math.isfinite(item) else "must be a finite number"
    return f"is not a JSON value ({type(item).__name__})"


def check_json(value: Any, field: str, max_depth: int = MAX_DEPTH) -> Any:
    """Raise `Invalid` when ``value`` cannot be stored as JSON; see `json_problem`."""
    problem = json_problem(value, field, max_depth)
    if problem:
        raise Invalid(dict([problem]))
    return value


def check_text(value: Any, field: str, max_length: int, *, required: bool = True) -> Any:
    """A string of at most ``max_length`` characters, stripped; ``Invalid`` names ``field``."""
    message = text_error(value, max_length, required=required)
    if message:
        raise Invalid({field: message})
    return value.strip() if isinstance(value, str) else value


def text_error(value: object, max_length: int, *, required: bool = True) -> str | None:
    """What is wrong with ``value`` as a bounded text field a person wrote, or None (clean text)."""
    if value is None and not required:
        return None
    if not isinstance(value, str):
        return f"must be a string, not {json_type(value)}"
    problem = clean_text_problem(value)
    if problem:
        return problem
    if required and not value.strip():
        return "may not be blank"
    if len(value) > max_length:
        return f"has at most {max_length} characters, got {len(value)}"
    return None


def json_type(value: object) -> str:
    """The JSON name of a value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def params_error(params: object) -> str | None:
    """What is wrong with a step's params as a whole (their size), or None.

    Call it after `json_problem` has passed them: only then is encoding them safe.
    """
    size = len(json.dumps(params, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > limit("EVENT_MAX_PARAMS_BYTES"):
        return f"params take {size} bytes; at most {limit('EVENT_MAX_PARAMS_BYTES')} (EVENT_MAX_PARAMS_BYTES)"
    return None


def parse_json(text: str | bytes, field: str = "", max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON text from a request, a command line or a form, and `check_json` it.

    `Invalid` names ``field`` (or ``body``) when the text is not JSON, and the path of the
    first value that cannot be stored otherwise.
    """
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise Invalid({field or "body": f"nests deeper than {max_depth} levels"}) from None
    except ValueError as exc:  # JSONDecodeError, NaN, and integers past 4,300 digits
        raise Invalid({field or "body": f"is not valid JSON: {exc}"}) from None
    return check_json(value, field, max_depth)


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")
