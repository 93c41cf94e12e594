"""What a log line knows: the run, module, backend and task it is about, and a JSON form.

`log_context(run=..., module=..., backend=..., task=...)` says what the code inside it
works on; every record logged inside (in this thread, or in a module call it starts,
which carries the context over) gets those fields, unless the call named its own with
``extra=about(...)``. (A record's own ``module`` is the Python module that logged it, so
the fields live on the record as ``about_run``, ``about_module`` and so on.)
`ContextFilter` puts them on the record, and `JsonFormatter` writes one JSON
object per line: ``time`` (RFC 3339, UTC), ``level``, ``logger``, ``message``, the fields
that are known, and ``exc`` with the traceback when there is one. The site picks it with
``LOG_FORMAT=json``.
May import: nothing of the engine.
"""

import contextvars
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

FIELDS = ("run", "module", "backend", "task")
PREFIX = "about_"


def about(**fields: object) -> dict[str, object]:
    """``extra=`` for one logging call: what this line is about (run, module, backend, task)."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise TypeError(f"a log line is about {', '.join(FIELDS)}, not {', '.join(sorted(unknown))}")
    return {PREFIX + k: v for k, v in fields.items() if v is not None and v != ""}


_context: contextvars.ContextVar[dict[str, object]] = contextvars.ContextVar("cleanup_log_context", default={})  # noqa: B039


@contextmanager
def log_context(**fields: object) -> Iterator[None]:
    """Inside this block, log records carry ``fields`` (None values are left out)."""
    known = {k[len(PREFIX) :]: v for k, v in about(**fields).items()}
    token = _context.set({**_context.get(), **known})
    try:
        yield
    finally:
        _context.reset(token)


def current() -> dict[str, Any]:
    """The fields the current context gives a record."""
    return dict(_context.get())


class ContextFilter(logging.Filter):
    """Gives each record the context's run, module, backend and task (never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _context.get().items():
            if not hasattr(record, PREFIX + name):
                setattr(record, PREFIX + name, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record and line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, PREFIX + name, None)
            if value is not None and value != "":
                entry[name] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)
