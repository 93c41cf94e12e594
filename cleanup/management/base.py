"""What every command of the app shares: bad input is one line on stderr and a non-zero exit.

A command subclasses `EventCommand` instead of ``BaseCommand`` and reads ids and JSON with
the argument types below. The engine's refusals (`cleanup.validation.Invalid`, a value the
database cannot hold) become a ``CommandError``, which Django prints as one line with exit
status 1; anything else that escapes a command run from the shell is also printed as one
line (``--traceback`` shows where it came from). A missing setting, such as
``SECRET_KEY``, is reported the same way by ``manage.py`` itself, before any command loads.

    from cleanup.management.base import EventCommand, json_value, object_id

    class Command(EventCommand):
        def add_arguments(self, parser):
            parser.add_argument("run_id", type=object_id)
            parser.add_argument("--params", type=json_value)
May import: `validation` only.
"""

import argparse
import sys
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import DataError

from .. import validation

# The largest id a BigAutoField holds: past it the database refuses the query itself.
MAX_ID = 2**63 - 1


def object_id(text: str) -> int:
    """An argparse type: a whole number from 1 to the largest id the database holds."""
    if not text.isdecimal() or not 0 < int(text) <= MAX_ID:
        raise argparse.ArgumentTypeError(f"an id is a whole number from 1 to {MAX_ID}, got {text!r}")
    return int(text)


def json_value(text: str) -> Any:
    """An argparse type: JSON text, checked by `cleanup.validation` like a request body."""
    try:
        return validation.parse_json(text, "value")
    except validation.Invalid as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def plain_text(text: str) -> str:
    """An argparse type: clean text (no NUL, control or bidirectional character), such as an actor."""
    problem = validation.clean_text_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


class EventCommand(BaseCommand):
    """A command that answers bad input with one line on stderr and exit status 1."""

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            return super().execute(*args, **options)
        except validation.Invalid as exc:
            raise CommandError(str(exc)) from None
        except (DataError, ImproperlyConfigured) as exc:
            raise CommandError(one_line(exc)) from None

    def run_from_argv(self, argv: list[str]) -> None:
        try:
            super().run_from_argv(argv)
        except Exception as exc:  # CommandError is handled inside; this is what escaped it
            if "--traceback" in argv:
                raise
            self.stderr.write(f"{type(exc).__name__}: {one_line(exc)} (--traceback shows where)")
            sys.exit(1)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:500] or type(exc).__name__
