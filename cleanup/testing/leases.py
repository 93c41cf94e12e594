"""The conformance checks of a lease: read, apply and restore on one real target.

The checks change the target's value for real and put the value they found back before
they answer; "someone else's value" is set through the lease's own ``apply``.
May import: `calls`, `registry` and the kit's own modules.
"""

import uuid
from typing import Any

from .. import calls
from ..calls import Answer, Outcome, Reply, Verdict
from ..registry import Lease
from .actions import wrong_value
from .backends import check_backend_of, check_health, check_paced_burst, resolve_backend
from .outage import Outage, network_down
from .report import Caller, Report, describe

RUN_ID = 0


def other_value(value: Any, original: Any) -> Any:
    """A third value, neither ``value`` nor ``original``, as another person would set it."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        other = value + 1
        return other + 1 if other == original else other
    if isinstance(value, str):
        return value + "-other" if value + "-other" != original else value + "-other2"
    return None


class LeaseChecks:
    def __init__(
        self, lease: Lease, target: str, value: Any, other: Any, outage: Outage | None, backend: str | None = None
    ) -> None:
        self.lease = lease
        self.target = target
        self.value = value
        self.other = other
        self.outage = outage
        self.given = backend
        self.named, self.backend_problem = resolve_backend(lease, target)
        # The backend every call is for: the one given, else the one the target names.
        self.backend: str = backend if backend is not None else (self.named or "")
        on = f" on backend {self.backend!r}" if self.backend else ""
        self.report = Report(f"lease {lease.id} on {target!r}{on}")
        self.call = Caller(lease, self.backend)
        self.original: Any = None

    def read(self, target: str | None = None) -> tuple[Answer, Reply]:
        answer = self.call("read", target=self.target if target is None else target)
        return answer, calls.classify_reply(answer, f"{self.lease.id}.read", key="value")

    def apply(self, value: Any) -> tuple[Answer, Reply]:
        answer = self.call("apply", value=value, run_id=RUN_ID, target=self.target)
        return answer, calls.classify_reply(answer, f"{self.lease.id}.apply")

    def restore(self, expected: Any) -> tuple[Answer, Verdict]:
        answer = self.call("restore", baseline=self.original, expected=expected, run_id=RUN_ID, target=self.target)
        return answer, calls.classify_revert(answer, f"{self.lease.id}.restore")

    def run(self) -> Report:
        report = self.report
        report.check("is registered with a module name", bool(self.lease.module), "a module name", "none")
        check_backend_of(report, self.lease, self.named, self.backend_problem, self.given, "target")
        self.check_validate()
        answer, reply = self.read()
        if not report.check(
            "read answers the value in force", reply.ok, '{"ok": True, "value": ...}', reply.error or describe(answer)
        ):
            self.call.report_on_calls(report)
            return report
        self.original = reply.value
        if not report.check(
            "the value to apply differs from the value in force",
            self.value != self.original,
            f"a value other than {self.original!r}",
            f"{self.value!r}",
        ):
            self.call.report_on_calls(report)
            return report
        try:
            self.check_round_trip()
            self.check_drift()
            self.check_missing_target()
            if self.outage is not None:
                self.check_outage(self.outage)
            else:
                report.skip("with the backend down, calls answer failures to retry", "no outage given")
            check_health(report, self.call, self.lease, self.outage)
            check_paced_burst(report, self.call, self.lease)
        finally:
            self.put_back()
        self.call.report_on_calls(report)
        return report

    def check_validate(self) -> None:
        validate = getattr(self.lease, "validate", None)
        if not callable(validate):
            self.report.skip("validate accepts the value", "the lease has no validate(value)")
            return
        try:
            validate(self.value)
            got = None
        except Exception as exc:
            got = f"{type(exc).__name__}: {exc}"
        self.report.check("validate accepts the value", got is None, "no exception", got)
        bad = wrong_value(self.value)
        try:
            validate(bad)
            return
        except ValueError as exc:
            got = None if str(exc).strip() else "ValueError without a message"
        except Exception as exc:
            got = f"{type(exc).__name__}: {exc} (validate must raise ValueError)"
        self.report.check(
            "validate refuses with a ValueError that says why",
            got is None,
            f"ValueError with a message for {bad!r}",
            got,
        )

    def check_round_trip(self) -> None:
        report = self.report
        answer, reply = self.apply(self.value)
        report.check("apply answers success", reply.ok, '{"ok": True}', reply.error or describe(answer))
        answer, reply = self.read()
        report.check(
            "read after apply answers the applied value",
            reply.ok and reply.value == self.value,
            repr(self.value),
            repr(reply.value) if reply.ok else reply.error,
        )
        answer, verdict = self.restore(self.value)
        report.check(
            "restore over the applied value answers success",
            verdict.outcome == Outcome.DONE,
            '{"ok": True}',
            describe(answer),
        )
        answer, reply = self.read()
        report.check(
            "read, apply and restore round-trip to the original value",
            reply.ok and reply.value == self.original,
            repr(self.original),
            repr(reply.value) if reply.ok else reply.error,
        )
        answer, verdict = self.restore(self.value)
        report.check(
            "restore when the baseline is already in place succeeds",
            verdict.outcome == Outcome.DONE,
            '{"ok": True}',
            describe(answer),
        )

    def check_drift(self) -> None:
        report = self.report
        name = "restore with a value someone else set answers drifted with the current value"
        other = self.other if self.other is not None else other_value(self.value, self.original)
        if other is None or other in (self.value, self.original):
            report.skip(name, "pass another value (neither the applied nor the original one)")
            return
        self.apply(self.value)
        _, reply = self.apply(other)  # someone else, through the same backend
        if not reply.ok:
            report.check(name, False, f"apply({other!r}) to stand for someone else", reply.error)
            return
        answer, verdict = self.restore(self.value)
        report.check(
            name,
            verdict.outcome == Outcome.DRIFTED and verdict.current == other,
            f'{{"ok": False, "drifted": True, "current": {other!r}}}',
            describe(answer),
        )
        answer, reply = self.read()
        report.check(
            "restore leaves someone else's value alone",
            reply.ok and reply.value == other,
            repr(other),
            repr(reply.value) if reply.ok else reply.error,
        )

    def check_missing_target(self) -> None:
        answer = self.call("read", target=f"kit-no-such-target-{uuid.uuid4().hex[:12]}")
        self.report.check(
            "read of a target that does not exist answers a value or a failure",
            not answer.exception and isinstance(answer.raw, dict),
            '{"ok": ...} envelope',
            describe(answer),
        )

    def check_outage(self, outage: Outage) -> None:
        report = self.report
        with outage():
            read_answer, read = self.read()
            apply_answer, applied = self.apply(self.value)
            restore_answer, verdict = self.restore(self.value)
        report.check(
            "with the backend down, read answers a failure to retry",
            not read.ok and read.retry,
            '{"ok": False, "error": "...", "retry": True}',
            describe(read_answer),
        )
        report.check(
            "with the backend down, apply answers a failure to retry",
            not applied.ok and applied.retry,
            '{"ok": False, "error": "...", "retry": True}',
            describe(apply_answer),
        )
        report.check(
            "with the backend down, restore answers a failure to retry",
            verdict.outcome == Outcome.RETRY,
            '{"ok": False, "error": "...", "retry": True}',
            describe(restore_answer),
        )

    def put_back(self) -> None:
        """Put the original value back over whatever the checks left in place."""
        _, reply = self.read()
        if reply.ok and reply.value != self.original:
            self.restore(reply.value)
            _, reply = self.read()
        self.report.check(
            "the kit's own cleanup puts the original value back",
            reply.ok and reply.value == self.original,
            repr(self.original),
            repr(reply.value) if reply.ok else reply.error,
        )


def run_lease_checks(
    lease: Lease,
    target: str,
    value: Any,
    other: Any = None,
    outage: Outage | None = network_down,
    *,
    backend: str | None = None,
) -> Report:
    """Every check of ``lease`` on ``target`` with ``value``; answers a `Report`.

    ``backend``: the backend every call is for; by default the one ``backend_of(target)``
    names.
    """
    return LeaseChecks(lease, target, value, other, outage, backend=backend).run()
