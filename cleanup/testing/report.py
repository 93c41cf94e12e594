"""What the conformance kit found: one `Check` per rule, and the calls it made to get there.

May import: `calls`, `registry`.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from .. import calls
from ..registry import Action, Lease

_Passed = TypeVar("_Passed")

OK, FAIL, SKIP = "ok", "FAIL", "skip"


@dataclass(frozen=True)
class Check:
    """One rule of the contract and what the module did about it."""

    name: str
    status: str
    expected: str = ""
    got: object = ""  # what the module did instead, as a person reads it (a sentence, or a list)

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def line(self) -> str:
        if self.status == OK:
            return f"ok   {self.name}"
        if self.status == SKIP:
            return f"skip {self.name}: {self.got}"
        return f"FAIL {self.name}: expected {self.expected}; got {self.got}"


@dataclass
class Report:
    """Every check of one action or lease, in the order they ran."""

    subject: str
    checks: list[Check] = field(default_factory=list)

    def check(self, name: str, passed: _Passed, expected: str = "", got: object = "") -> _Passed:
        """Record one check, passed when ``passed`` is true; answers ``passed``."""
        self.checks.append(Check(name, OK if passed else FAIL, expected, "" if passed else got))
        return passed

    def skip(self, name: str, why: str) -> None:
        self.checks.append(Check(name, SKIP, got=why))

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.failed]

    def lines(self) -> list[str]:
        return [c.line() for c in self.checks]

    def assert_ok(self) -> Self:
        """Raise ``AssertionError`` listing every failed check; answers the report otherwise."""
        if self.failures:
            listed = "\n".join(c.line() for c in self.failures)
            raise AssertionError(f"{self.subject} breaks the module contract:\n{listed}")
        return self


def envelope_problem(raw: object) -> str | None:
    """What is wrong with an answer as an envelope, or None for a well-formed one."""
    if not isinstance(raw, dict):
        return f"answered {'nothing' if raw is None else 'a ' + type(raw).__name__} instead of a dict"
    ok = raw.get("ok")
    if ok is not True and ok is not False:
        return f"answered ok={ok!r}; `ok` must be True or False"
    if "retry" in raw and not isinstance(raw["retry"], bool):
        return f"answered retry={raw['retry']!r}; `retry` must be True or False"
    if ok is False and raw.get("drifted") is True:
        return None if "current" in raw else "answered drifted without `current`"
    if ok is False:
        error = raw.get("error")
        if not isinstance(error, str) or not error.strip():
            return "answered a failure without an `error` sentence a person can act on"
    return None


class Caller:
    """Calls one action's or lease's callables as the engine does, and remembers how each went.

    Every call goes through `cleanup.calls.call` under the entry's budget, so it is
    abandoned when late and never raises here; what it raised, the calls that ran out of
    budget and the answers that are no envelope are reported at the end. ``backend`` is
    handed to every callable that takes it, as the engine hands a step's or a row's
    backend (``None``: none at all).
    """

    def __init__(self, entry: Action | Lease, backend: str | None = None) -> None:
        self.entry = entry
        self.backend = backend
        self.budget_ms: int = calls.budget_of(entry)
        self.count = 0
        self.slowest_ms = 0
        self.late: list[str] = []
        self.raised: list[str] = []
        self.malformed: list[str] = []

    def __call__(self, name: str, **kwargs: Any) -> calls.Answer:
        return self.invoke(getattr(self.entry, name), f"{self.entry.id}.{name}", **kwargs)

    def invoke(self, fn: Any, what: str, **kwargs: Any) -> calls.Answer:
        """Call ``fn`` (one of the module's callables) as the engine would."""
        started = time.monotonic()
        answer = calls.call(fn, budget_ms=self.budget_ms, what=what, backend=self.backend, **kwargs)
        self.count += 1
        self.slowest_ms = max(self.slowest_ms, round((time.monotonic() - started) * 1000))
        if answer.timed_out:
            self.late.append(what)
        elif answer.exception:
            self.raised.append(answer.exception)
        else:
            problem = envelope_problem(answer.raw)
            if problem:
                self.malformed.append(f"{what} {problem}")
        return answer

    def report_on_calls(self, report: Report) -> None:
        report.check(
            "every callable answers an envelope",
            not self.malformed,
            "a dict whose `ok` is True or False, a failure with `error`",
            "; ".join(self.malformed),
        )
        report.check("no call raises", not self.raised, "no exception", "; ".join(self.raised))
        report.check(
            f"every call answers within its budget ({self.budget_ms} ms)",
            not self.late,
            f"{self.count} calls within {self.budget_ms} ms each",
            f"no answer in time from {', '.join(self.late)}",
        )


def describe(answer: calls.Answer) -> str:
    """An answer as a person reads it in a FAIL line."""
    if answer.exception:
        return answer.exception
    return repr(answer.raw)
