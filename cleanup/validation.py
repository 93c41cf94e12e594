"""The checks every write path runs on what it is handed, in one place.
Imports only `cleanup.conf` (the limits on a run), so that every door may import it.

The API, the admin and the commands all store what a person or a console sends: a run's
name and steps, a lease's target, a waiver's reason. Whatever the door, the value is
checked here before anything reaches the database, and a refusal names the field it is
about (``steps[3].params.x``), so that PostgreSQL never sees a NUL, a lone surrogate or
an infinity, and nothing unbounded is stored.

`json_problem` walks a JSON value without recursion, so a body nested ten thousand levels
deep is refused like one nested thirty-three, instead of exhausting the stack.
May import: conf only.
"""

import json
import math

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

    def __init__(self, errors):
        self.errors = dict(errors)
        super().__init__("; ".join(f"{field}: {message}" for field, message in self.errors.items()))


def limit(name):
    """A limit on what one run may hold (``EVENT_MAX_STEPS``, ``EVENT_MAX_PARAMS_BYTES``), read now."""
    return setting(name)


def field_path(parent, key):
    """``parent.key`` for a plain key, ``parent[3]`` for an index, ``parent["a b"]`` otherwise."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if key.isidentifier() and key.isascii():
        return f"{parent}.{key}" if parent else key
    # json.dumps escapes what a message cannot carry (a NUL, a lone surrogate).
    return f"{parent}[{json.dumps(key)}]"


def text_problem(value):
    """What is wrong with a string as stored text, or None."""
    if "\x00" in value:
        return "may not contain a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    return None


def json_problem(value, where="", max_depth=MAX_DEPTH):
    """The first ``(field, message)`` that keeps ``value`` from being stored as JSON, or None.

    Objects and arrays may nest ``max_depth`` levels; numbers are finite, whole numbers
    fit in 64 bits; strings and keys are valid Unicode without NUL.
    """
    pending = [(value, where, 0)]
    while pending:
        item, path, depth = pending.pop()
        problem = _scalar_problem(item)
        if problem:
            return path or "body", problem
        if isinstance(item, dict | list):
            if depth >= max_depth:
                return path or "body", f"nests deeper than {max_depth} levels"
            children = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in children:
                if isinstance(item, dict):
                    if not isinstance(key, str):
                        return path or "body", "object keys must be strings"
                    key_problem = text_problem(key)
                    if key_problem:
                        return field_path(path, key), f"its name {key_problem}"
                pending.append((child, field_path(path, key), depth + 1))
    return None


def _scalar_problem(item):
    if item is None or isinstance(item, bool | dict | list):
        return None
    if isinstance(item, str):
        return text_problem(item)
    if isinstance(item, int):
        return None if -MAX_INT <= item <= MAX_INT else "is a whole number larger than 64 bits"
    if isinstance(item, float):
        return None if math.isfinite(item) else "must be a finite number"
    return f"is not a JSON value ({type(item).__name__})"


def check_json(value, field, max_depth=MAX_DEPTH):
    """Raise `Invalid` when ``value`` cannot be stored as JSON; see `json_problem`."""
    problem = json_problem(value, field, max_depth)
    if problem:
        raise Invalid(dict([problem]))
    return value


def check_text(value, field, max_length, *, required=True):
    """A string of at most ``max_length`` characters, stripped; ``Invalid`` names ``field``."""
    message = text_error(value, max_length, required=required)
    if message:
        raise Invalid({field: message})
    return value.strip() if isinstance(value, str) else value


def text_error(value, max_length, *, required=True):
    """What is wrong with ``value`` as a bounded text field, or None."""
    if value is None and not required:
        return None
    if not isinstance(value, str):
        return f"must be a string, not {json_type(value)}"
    problem = text_problem(value)
    if problem:
        return problem
    if required and not value.strip():
        return "may not be blank"
    if len(value) > max_length:
        return f"has at most {max_length} characters, got {len(value)}"
    return None


def json_type(value):
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


def params_error(params):
    """What is wrong with a step's params as a whole (their size), or None.

    Call it after `json_problem` has passed them: only then is encoding them safe.
    """
    size = len(json.dumps(params, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > limit("EVENT_MAX_PARAMS_BYTES"):
        return f"params take {size} bytes; at most {limit('EVENT_MAX_PARAMS_BYTES')} (EVENT_MAX_PARAMS_BYTES)"
    return None


def parse_json(text, field="", max_depth=MAX_DEPTH):
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


def _refuse_constant(name):
    raise ValueError(f"{name} is not a JSON number")
