"""The engine's invariants under any sequence of answers, sweeps, time and people.

Hypothesis drives runs, module answers, sweeps, backoffs, a person's retries and
waivers in random order, and checks after every step what must always hold: no run in
flight is touched, no counter passes the ceiling, no claim outlives its sweep, nothing is
given back twice, a terminal verdict is never retried automatically, and a swept run's
cleanup status says what its rows say.
"""

from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cleanup import registry
from cleanup.manual import waive
from cleanup.models import UNRESOLVED, Resource, Run, RunStatus
from cleanup.sweep import cleanup_run, sweep
from tests.fakes import FakeAction, FakeLease, make_lease_row, make_rows, make_run, make_step

MAX_ATTEMPTS = 3

ANSWERS = st.sampled_from(["ok", "ok-first-failed", "retry", "terminal", "drifted", "raise", "none"])


class CleanupMachine(RuleBasedStateMachine):
    @initialize()
    def start(self):
        Run.objects.all().delete()
        self.clock = time_machine.travel(timezone.now(), tick=False)
        self.traveller = self.clock.start()
        self.script = ["ok"]
        self.given_back = []  # refs the module said it gave back
        self.swept_runs = set()
        self.serial = 0
        registry.unregister_module("test")
        registry.register_action(FakeAction(revert=self.revert))

    def teardown(self):
        if hasattr(self, "clock"):
            self.clock.stop()

    def revert(self, *, run_id, resources, idempotency_key):
        answer = self.script[0]
        refs = [r["ref"] for r in resources]
        if answer == "raise":
            raise RuntimeError("module crashed")
        if answer == "none":
            return None
        if answer == "retry":
            return {"ok": False, "error": "shard down"}
        if answer == "terminal":
            return {"ok": False, "error": "never", "retry": False}
        if answer == "drifted":
            return {"ok": False, "drifted": True, "current": 9}
        failed = refs[:1] if answer == "ok-first-failed" else []
        self.given_back.extend(r for r in refs if r not in failed)
        return {"ok": True, "failed": failed}

    @rule(steps=st.integers(1, 3), rows=st.integers(0, 3), running=st.booleans(), auto=st.booleans())
    def add_run(self, steps, rows, running, auto):
        status = RunStatus.RUNNING if running else RunStatus.COMPLETED
        run = make_run(status=status, auto_cleanup=auto or running)
        for _ in range(steps):
            self.serial += 1
            make_rows(make_step(run), [f"r{self.serial}-{i}" for i in range(rows)])

    @precondition(lambda self: Run.objects.filter(status=RunStatus.RUNNING).exists())
    @rule(data=st.data())
    def end_a_run(self, data):
        run = data.draw(st.sampled_from(list(Run.objects.filter(status=RunStatus.RUNNING))))
        Run.objects.filter(pk=run.pk).update(status=RunStatus.ABORTED)

    @rule(answer=ANSWERS)
    def module_answers(self, answer):
        self.script = [answer]

    @rule()
    def sweep_once(self):
        before = {r.pk: (r.revert_attempts, r.state) for r in Resource.objects.filter(retryable=False)}
        result = sweep()
        self.swept_runs.update(Run.objects.filter(log__kind="cleanup.swept").values_list("pk", flat=True))
        after = {r.pk: (r.revert_attempts, r.state) for r in Resource.objects.filter(pk__in=before)}
        assert after == before, "a terminal verdict was retried automatically"
        assert result.summary.attempted >= 0

    @rule(seconds=st.sampled_from([1, 30, 61, 200]))
    def time_passes(self, seconds):
        self.traveller.shift(timedelta(seconds=seconds))

    @precondition(lambda self: Run.objects.exclude(status=RunStatus.RUNNING).exists())
    @rule(data=st.data())
    def a_person_retries(self, data):
        run = data.draw(st.sampled_from(list(Run.objects.exclude(status=RunStatus.RUNNING))))
        cleanup_run(run, reset=True, actor="person")
        self.swept_runs.add(run.pk)

    @precondition(lambda self: Resource.objects.filter(state__in=UNRESOLVED).exists())
    @rule(data=st.data())
    def a_person_waives(self, data):
        row = data.draw(st.sampled_from(list(Resource.objects.filter(state__in=UNRESOLVED))))
        waive([row], "left in the world on purpose", "person")

    @invariant()
    def runs_in_flight_are_untouched(self):
        if not hasattr(self, "clock"):
            return
        touched = Resource.objects.filter(run__status=RunStatus.RUNNING).exclude(state__in=("live", "waived"))
        assert not touched.exists()
        assert not Resource.objects.filter(run__status=RunStatus.RUNNING, revert_attempts__gt=0).exists()

    @invariant()
    def counters_stay_under_the_ceiling_and_no_claim_outlives_its_sweep(self):
        assert not Resource.objects.filter(revert_attempts__gt=MAX_ATTEMPTS).exists()
        assert not Resource.objects.filter(state="reverting").exists()

    @invariant()
    def nothing_is_given_back_twice(self):
        if hasattr(self, "given_back"):
            assert len(self.given_back) == len(set(self.given_back))

    @invariant()
    def the_cleanup_status_says_what_the_rows_say(self):
        if not hasattr(self, "swept_runs"):
            return
        for run in Run.objects.filter(pk__in=self.swept_runs).exclude(status=RunStatus.RUNNING):
            rows = Resource.objects.filter(run=run)
            unresolved = rows.filter(state__in=UNRESOLVED)
            retryable = unresolved.filter(
                state__in=("live", "failed"), retryable=True, revert_attempts__lt=MAX_ATTEMPTS
            )
            if not unresolved.exists():
                expected = {"complete", "not_required"}
            elif run.auto_cleanup and retryable.exists():
                expected = {"pending"}
            else:
                expected = {"incomplete"}
            assert run.cleanup_status in expected, (run.pk, run.cleanup_status, list(rows.values("ref", "state")))


@pytest.mark.slow
@pytest.mark.django_db
@override_settings(EVENT_REVERT_MAX_ATTEMPTS=MAX_ATTEMPTS, EVENT_REVERT_BACKOFF_S=30, EVENT_DEFAULT_BUDGET_MS=2000)
def test_the_engine_keeps_its_invariants_whatever_happens():
    run_state_machine = CleanupMachine.TestCase
    run_state_machine.settings = settings(
        max_examples=20,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    run_state_machine().runTest()


class LeaseStackMachine(RuleBasedStateMachine):
    """Rule 13 under any interleaving: runs lease one target, applies land or not (and
    answers get lost), runs end in any order, restores fail now and then. Whenever no
    lease on the target is unresolved, the target holds its original value."""

    ORIGINAL = 1

    @initialize()
    def start(self):
        Run.objects.all().delete()
        registry.unregister_module("test")
        self.lease = registry.register_lease(FakeLease(values={"camp": self.ORIGINAL}, restore=self.restore))
        self.flaky = False
        self.in_flight = {}  # row id -> value an apply still on its way will set

    def restore(self, *, baseline, expected, run_id, target):
        if self.flaky:
            self.flaky = False
            return {"ok": False, "error": "shard hiccup"}
        current = self.lease.values[target]
        if current == baseline:
            return {"ok": True}
        if current != expected:
            return {"ok": False, "drifted": True, "current": current}
        self.lease.values[target] = baseline
        return {"ok": True}

    @rule(value=st.integers(2, 9), outcome=st.sampled_from(["confirmed", "answer lost", "failed", "in flight"]))
    def a_run_leases_the_target(self, value, outcome):
        run = make_run(status=RunStatus.RUNNING)
        row = make_lease_row(run, baseline=self.lease.values["camp"], applied=value)
        if outcome in ("confirmed", "answer lost"):
            self.lease.values["camp"] = value
        if outcome == "in flight":
            self.in_flight[row.pk] = value
        if outcome != "confirmed":
            row.payload["confirmed"] = False
            row.save(update_fields=["payload"])
            if outcome != "in flight":
                Run.objects.filter(pk=run.pk).update(status=RunStatus.ABORTED)

    @precondition(lambda self: bool(getattr(self, "in_flight", None)))
    @rule(data=st.data(), confirmed=st.booleans())
    def an_apply_on_its_way_lands(self, data, confirmed):
        row_id = data.draw(st.sampled_from(sorted(self.in_flight)))
        value = self.in_flight.pop(row_id)
        row = Resource.objects.get(pk=row_id)
        if row.state not in UNRESOLVED:
            return  # its run was given back first; the call would be refused by key in a real module
        self.lease.values["camp"] = value
        if confirmed:
            row.payload["confirmed"] = True
            row.save(update_fields=["payload"])
        else:
            Run.objects.filter(pk=row.run_id).update(status=RunStatus.ABORTED)

    @precondition(lambda self: Run.objects.filter(status=RunStatus.RUNNING).exists())
    @rule(data=st.data())
    def a_run_ends(self, data):
        run = data.draw(st.sampled_from(list(Run.objects.filter(status=RunStatus.RUNNING).order_by("id"))))
        Run.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED)
        self.in_flight = {k: v for k, v in self.in_flight.items() if Resource.objects.get(pk=k).run_id != run.pk}

    @rule()
    def the_shard_hiccups_once(self):
        self.flaky = True

    @rule()
    def sweep_once(self):
        sweep()

    @invariant()
    def with_no_lease_open_the_target_holds_its_original_value(self):
        if not hasattr(self, "lease"):
            return
        assert not Resource.objects.filter(state="drifted").exists(), list(Resource.objects.values())
        if not Resource.objects.filter(state__in=UNRESOLVED).exists() and not self.in_flight:
            assert self.lease.values["camp"] == self.ORIGINAL, list(Resource.objects.values("id", "state", "payload"))


@pytest.mark.slow
@pytest.mark.django_db
@override_settings(EVENT_REVERT_MAX_ATTEMPTS=100, EVENT_REVERT_BACKOFF_S=0)
def test_stacked_leases_always_leave_the_original_value():
    machine = LeaseStackMachine.TestCase
    machine.settings = settings(
        max_examples=40,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    machine().runTest()
