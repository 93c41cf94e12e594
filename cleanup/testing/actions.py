"""The conformance checks of an action: validate, perform, revert and reconcile.

The checks perform for real on the module's backend, under fresh idempotency keys, and
give back everything they made before they answer (through the module's own ``revert``,
then verified through its ``reconcile``).
May import: `calls`, `registry` and the kit's own modules.
"""

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from .. import calls, registry
from ..calls import Answer, Outcome, Performed, Verdict
from ..registry import Action
from .backends import check_backend_of, check_health, check_paced_burst, resolve_backend
from .outage import Outage, Refusal, network_down
from .report import Caller, Report, describe
from .switch import check_switch

# The run and step ids the kit performs under: no such run exists in any ledger.
RUN_ID = 0
STEP_ID = 0


def new_key() -> str:
    return f"kit-{uuid.uuid4().hex}"


def wrong_value(value: object) -> object:
    """A value of another JSON type than ``value``, to see whether validate notices."""
    if isinstance(value, bool):
        return "not-a-boolean"
    if isinstance(value, int | float):
        return "not-a-number"
    if isinstance(value, str):
        return ["not", "a", "string"]
    if isinstance(value, list):
        return "not-a-list"
    if isinstance(value, dict):
        return "not-an-object"
    return {"unexpected": True}


class ActionChecks:
    def __init__(
        self,
        action: Action,
        params: dict[str, Any],
        outage: Outage | None,
        backend: str | None = None,
        refuse: Refusal | None = None,
        switch: bool = True,
    ) -> None:
        self.action = action
        self.params = params
        self.outage = outage
        self.refuse = refuse
        self.switch = switch
        self.given = backend
        self.named, self.backend_problem = resolve_backend(action, params)
        # The backend every call is for: the one given, else the one the params name.
        self.backend: str = backend if backend is not None else (self.named or "")
        self.report = Report(f"action {action.id}" + (f" on backend {self.backend!r}" if self.backend else ""))
        self.call = Caller(action, self.backend)
        self.keys: list[str] = []  # every key performed under, given back at the end
        self.made: dict[str, dict[str, Any]] = {}  # key -> {ref: resource}, everything any perform reported
        self.asked_failed: list[str] = []  # `failed` refs a revert named that it was not asked about
        self.bad_failed: list[str] = []  # `failed` answers of another shape than a list or an object of reasons

    # -- calls -----------------------------------------------------------------------
    def perform(self, params: dict[str, Any], key: str | None = None) -> tuple[str, Answer, Performed]:
        key = key or new_key()
        if key not in self.keys:
            self.keys.append(key)
        answer = self.call("perform", run_id=RUN_ID, step_id=STEP_ID, params=params, idempotency_key=key)
        performed = calls.classify_perform(answer, f"{self.action.id}.perform")
        for item in performed.resources:
            self.made.setdefault(key, {}).setdefault(item["ref"], item)
        return key, answer, performed

    def revert(self, resources: Sequence[Any], key: str) -> tuple[Answer, Verdict]:
        answer = self.call("revert", run_id=RUN_ID, resources=list(resources), idempotency_key=key)
        refs = [r.get("ref") for r in resources if isinstance(r, dict)]
        raw = answer.raw
        if isinstance(raw, dict) and raw.get("ok") is True:
            self.note_failed(raw.get("failed"), refs)
        return answer, calls.classify_revert(answer, f"{self.action.id}.revert", refs=refs)

    def note_failed(self, failed: object, refs: Sequence[object]) -> None:
        """Keep what is wrong with a successful revert's ``failed``: its shape, its refs."""
        if failed is None:
            return
        if isinstance(failed, dict):
            if not all(isinstance(r, str) and (v is None or isinstance(v, str)) for r, v in failed.items()):
                self.bad_failed.append(f"{failed!r:.200}")
            self.asked_failed += [r for r in failed if r not in refs]
        elif isinstance(failed, list):
            if not all(isinstance(r, str) for r in failed):
                self.bad_failed.append(f"{failed!r:.200}")
            self.asked_failed += [r for r in failed if r not in refs]
        else:
            self.bad_failed.append(f"{failed!r:.200}")

    def in_force(self, resources: Sequence[Any]) -> Any:
        """The refs in force among ``resources`` (a frozenset), or the failed `Reply`."""
        if not self.has("reconcile"):
            return None
        answer = self.call("reconcile", run_id=RUN_ID, resources=list(resources))
        return calls.classify_reconcile(answer, f"{self.action.id}.reconcile")

    def has(self, name: str) -> bool:
        return callable(getattr(self.action, name, None))

    # -- the checks ----------------------------------------------------------------------
    def run(self) -> Report:
        report = self.report
        report.check("is registered with a module name", bool(self.action.module), "a module name", "none")
        check_backend_of(report, self.action, self.named, self.backend_problem, self.given, "params")
        try:
            self.check_validate()
            made = self.check_perform()
            if made is not None and self.has("revert"):
                self.check_revert(*made)
                self.check_revert_by_key()
                self.check_refusal()
                self.check_failed()
            elif not self.has("revert"):
                report.check(
                    "declares revert", False, "a revert(), or nothing it makes can be given back", "no callable revert"
                )
            self.check_refusals()
            if self.switch:
                check_switch(self, _keepalive_of(self.action))
            if self.outage is not None:
                self.check_outage(self.outage)
            else:
                report.skip("with the backend down, calls answer failures to retry", "no outage given")
            check_health(report, self.call, self.action, self.outage)
            check_paced_burst(report, self.call, self.action)
        finally:
            self.clean_up()
        self.call.report_on_calls(report)
        return report

    def check_validate(self) -> None:
        report, validate = self.report, getattr(self.action, "validate", None)
        if not callable(validate):
            report.skip("validate names the bad field", "the action has no validate(params)")
            return
        try:
            validate(dict(self.params))
            accepted = None
        except Exception as exc:
            accepted = f"{type(exc).__name__}: {exc}"
        report.check("validate accepts the params given", accepted is None, "no exception", accepted)
        for name, value in self.params.items():
            bad = {**self.params, name: wrong_value(value)}
            got: str | None
            try:
                validate(bad)
                got = f"validate accepted {name}={bad[name]!r}"
            except ValueError as exc:
                got = None if name in str(exc) else f"ValueError({str(exc)!r}), which does not name {name}"
            except Exception as exc:
                got = f"{type(exc).__name__}: {exc} (validate must raise ValueError)"
            report.check(
                f"validate names the bad field ({name})",
                got is None,
                f"ValueError naming {name!r} for {name}={bad[name]!r}",
                got,
            )

    def check_perform(self) -> tuple[str, tuple[Any, ...]] | None:
        """Perform, then again with the same key; answers ``(key, resources)`` or None."""
        report = self.report
        key, answer, first = self.perform(dict(self.params))
        if not report.check(
            "perform answers resources", first.ok, '{"ok": True, "resources": [...]}', first.error or describe(answer)
        ):
            return None
        refs = sorted(r["ref"] for r in first.resources)
        _, answer, second = self.perform(dict(self.params), key)
        again = sorted(r["ref"] for r in second.resources) if second.ok else None
        report.check(
            "perform twice with one key makes the same refs and nothing new",
            again == refs,
            f"the same refs {refs}",
            f"{again}" if second.ok else second.error,
        )
        if not first.resources:
            report.skip("revert gives back what perform made", "perform made nothing with these params")
            return None
        if self.has("reconcile"):
            reply = self.in_force(first.resources)
            report.check(
                "reconcile reports what perform made as in force",
                reply.ok and reply.value >= set(refs),
                f"in_force containing {refs}",
                sorted(reply.value) if reply.ok else reply.error,
            )
        return key, first.resources

    def check_revert(self, key: str, resources: Sequence[Any]) -> None:
        report = self.report
        resources = list(resources)
        half = resources[: max(1, len(resources) // 2)]
        _, verdict = self.revert(half, key)
        report.check(
            "revert of part of a step's rows answers success",
            _done(verdict),
            '{"ok": True, "failed": []}',
            _said(verdict),
        )
        _, verdict = self.revert(resources, key)
        report.check(
            "revert gives back what perform made (some already gone)",
            _done(verdict),
            '{"ok": True, "failed": []}',
            _said(verdict),
        )
        _, verdict = self.revert(resources, key)
        report.check(
            "a second revert of the same rows answers success",
            _done(verdict),
            '{"ok": True, "failed": []}',
            _said(verdict),
        )
        self.check_gone("reconcile after a revert reports nothing in force", resources)

    def check_failed(self) -> None:
        """What every revert so far answered in ``failed``: refs it was asked about, as a
        list or an object of reasons."""
        report = self.report
        report.check(
            "failed names only refs it was asked about",
            not self.asked_failed,
            "refs of the list handed over",
            f"{sorted(set(self.asked_failed))}",
        )
        report.check(
            "failed is a list of refs or an object of refs and reasons",
            not self.bad_failed,
            '["ref", ...] or {"ref": "why", ...}',
            "; ".join(self.bad_failed),
        )

    def check_refusal(self) -> None:
        """With the backend refusing one thing, revert names it in ``failed``, with its
        reason, and gives back the rest."""
        report = self.report
        name = "revert names what the backend refused as failed and gives back the rest"
        reasons = "revert says why for each ref it could not give back"
        if self.refuse is None:
            report.skip(name, "no refusal given (refuse=): the kit cannot make the backend refuse")
            return
        key, answer, performed = self.perform(dict(self.params))
        if not performed.ok or not performed.resources:
            report.check(name, False, "a perform that makes something to refuse", performed.error or describe(answer))
            return
        held = [performed.resources[0]["ref"]]
        with self.refuse(held):
            answer, verdict = self.revert(list(performed.resources), key)
        if not report.check(
            name,
            verdict.outcome == Outcome.DONE and verdict.failed == set(held),
            f'{{"ok": True, "failed": {{{held[0]!r}: "why"}}}}',
            _said(verdict),
        ):
            return
        raw = answer.raw
        failed = raw.get("failed") if isinstance(raw, dict) else None
        if not isinstance(failed, dict):
            report.skip(reasons, "failed is a list: each row can only say that it was not given back")
            return
        report.check(
            reasons,
            set(verdict.reasons) >= set(held),
            f'{{{held[0]!r}: "why it was refused"}}',
            f"{failed!r:.300}",
        )

    def check_revert_by_key(self) -> None:
        report = self.report
        key, answer, performed = self.perform(dict(self.params))
        if not performed.ok:
            report.check(
                "revert of an empty list by key succeeds",
                False,
                "a perform to revert",
                performed.error or describe(answer),
            )
            return
        _, verdict = self.revert([], key)
        report.check(
            "revert of an empty list by key succeeds", _done(verdict), '{"ok": True, "failed": []}', _said(verdict)
        )
        if performed.resources:
            self.check_gone("revert of an empty list gives back what the key made", performed.resources)

    def check_gone(self, name: str, resources: Sequence[Any]) -> None:
        if not self.has("reconcile"):
            self.report.skip(name, "the action has no reconcile(), so the kit cannot look")
            return
        reply = self.in_force(resources)
        self.report.check(
            name,
            reply.ok and not reply.value,
            '{"ok": True, "in_force": []}',
            f"still in force: {sorted(reply.value)}" if reply.ok else reply.error,
        )

    def check_refusals(self) -> None:
        """Bad input gets an envelope, and a perform with bad params a terminal one."""
        report = self.report
        if self.params:
            name, value = next(iter(self.params.items()))
            _, answer, performed = self.perform({**self.params, name: wrong_value(value)})
            report.check(
                f"perform refuses a bad {name} as a terminal failure",
                not performed.ok and not performed.retry and not answer.exception,
                '{"ok": False, "error": "...", "retry": False}',
                describe(answer),
            )
        if self.has("revert"):
            answer, _ = self.revert([{"kind": "thing"}], new_key())
            report.check(
                "revert of a malformed resource list answers a failure",
                not answer.exception and _refused(answer),
                '{"ok": False, "error": ...}',
                describe(answer),
            )
        if self.has("reconcile"):
            answer = self.call("reconcile", run_id=RUN_ID, resources=[{"kind": "thing"}])
            report.check(
                "reconcile of a malformed resource list answers a failure",
                not answer.exception and _refused(answer),
                '{"ok": False, "error": ...}',
                describe(answer),
            )

    def check_outage(self, outage: Outage) -> None:
        report = self.report
        known = [r for rows in self.made.values() for r in rows.values()][:1]
        known = known or [{"kind": "thing", "ref": "kit-unknown", "payload": {}, "member_key": ""}]
        with outage():
            _, answer, performed = self.perform(dict(self.params))
            revert_answer, verdict = self.revert(known, new_key()) if self.has("revert") else (None, None)
            reply = self.in_force(known)
        report.check(
            "with the backend down, perform answers a failure to retry",
            not performed.ok and performed.retry,
            '{"ok": False, "error": "...", "retry": True}',
            describe(answer),
        )
        if verdict is not None and revert_answer is not None:
            report.check(
                "with the backend down, revert answers a failure to retry",
                verdict.outcome == Outcome.RETRY,
                '{"ok": False, "error": "...", "retry": True}',
                describe(revert_answer),
            )
        if reply is not None:
            report.check(
                "with the backend down, reconcile answers a failure, never a list",
                not reply.ok,
                '{"ok": False, "error": "...", "retry": True}',
                f"in_force {sorted(reply.value)}" if reply.ok else reply.error,
            )

    def clean_up(self) -> None:
        """Give back everything any check made, by key and by ref, and say what is left."""
        if not self.has("revert"):
            return
        for key in self.keys:
            self.revert(list(self.made.get(key, {}).values()), key)
            self.revert([], key)
        everything = [r for rows in self.made.values() for r in rows.values()]
        if everything and self.has("reconcile"):
            reply = self.in_force(everything)
            left = sorted(reply.value) if reply.ok else None
            self.report.check(
                "the kit's own cleanup leaves nothing in force",
                reply.ok and not left,
                "nothing in force",
                f"still in force: {left}" if reply.ok else reply.error,
            )


def _keepalive_of(action: Action) -> Any:
    """The ``keepalive`` of the action's module (on any of its actions or leases), or None."""
    entries: list[Any] = [action, *registry.actions().values(), *registry.leases().values()]
    for entry in entries:
        fn = getattr(entry, "keepalive", None)
        if entry.module == action.module and callable(fn):
            return fn
    return None


def _done(verdict: Verdict) -> bool:
    return verdict.outcome == Outcome.DONE and not verdict.failed


def _said(verdict: Verdict) -> str:
    if verdict.outcome == Outcome.DONE:
        return f"failed {sorted(verdict.failed)}"
    return f"{verdict.outcome}: {verdict.error}"


def _refused(answer: Answer) -> bool:
    return isinstance(answer.raw, dict) and answer.raw.get("ok") is False


def run_action_checks(
    action: Action,
    params: Mapping[str, Any],
    outage: Outage | None = network_down,
    *,
    backend: str | None = None,
    refuse: Refusal | None = None,
    switch: bool = True,
) -> Report:
    """Every check of ``action`` with ``params``; answers a `Report`, never raises for a failure.

    ``switch``: when the module declares ``keepalive``, check its dead-man's switch (a short
    ttl armed, not renewed, the world read back: `cleanup.testing.switch`), which waits a
    few seconds; False skips it.

    ``backend``: the backend every call is for (the engine's ``backend`` keyword); by
    default the one ``backend_of(params)`` names. ``refuse``: a context manager factory
    taking refs, during which the backend refuses to give those back (the kit then checks
    that ``revert`` names them in ``failed``, with reasons), or None to skip that check.
    """
    return ActionChecks(action, dict(params), outage, backend=backend, refuse=refuse, switch=switch).run()
