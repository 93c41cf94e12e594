"""One module, many backends: each with its own health, outages, restarts and concurrency."""

import threading
import time
from datetime import timedelta

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from cleanup import outages, registry, rows
from cleanup.models import Attempt, ModuleHealth, Resource, ResourceState, Step
from cleanup.reconcile import reconcile_module
from cleanup.runner import RunSpecError, advance, start_run, tick
from cleanup.sweep import sweep
from tests.fakes import FakeLease, make_lease_row, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db


class Fleet(registry.Action):
    """A module over two shards, ``north`` and ``south``, each with its own world."""

    id = "fleet.spawn"
    module = "fleet"

    def __init__(self):
        self.worlds = {"north": set(), "south": set()}
        self.down = set()
        self.boot = {"north": "boot-n1", "south": "boot-s1"}
        self.calls = []
        self._lock = threading.Lock()

    def backend_of(self, params):
        return params.get("shard", "")

    def validate(self, params):
        if params.get("shard") not in self.worlds:
            raise ValueError(f"shard must be one of {sorted(self.worlds)}")

    def _call(self, name, backend, **kwargs):
        with self._lock:
            self.calls.append((name, backend, kwargs))
        if backend in self.down:
            return {"ok": False, "error": f"{backend} does not answer", "unavailable": True}
        return None

    def perform(self, *, run_id, step_id, params, idempotency_key, backend):
        if (refused := self._call("perform", backend)) is not None:
            return refused
        refs = [f"{backend}-{idempotency_key[:6]}-{i}" for i in range(params.get("count", 1))]
        self.worlds[backend].update(refs)
        return {"ok": True, "resources": [{"kind": "creature", "ref": ref} for ref in refs]}

    def revert(self, *, run_id, resources, idempotency_key, backend):
        if (refused := self._call("revert", backend, refs=[r["ref"] for r in resources])) is not None:
            return refused
        for r in resources:
            self.worlds[backend].discard(r["ref"])
        return {"ok": True, "failed": []}

    def reconcile(self, *, run_id, resources, backend):
        if (refused := self._call("reconcile", backend)) is not None:
            return refused
        return {"ok": True, "in_force": [r["ref"] for r in resources if r["ref"] in self.worlds[backend]]}

    def health(self, *, backend):
        if (refused := self._call("health", backend)) is not None:
            return refused
        return {"ok": True, "boot_id": self.boot[backend]}


@pytest.fixture
def fleet():
    action = Fleet()
    registry.register_action(action)
    yield action
    registry.unregister_module("fleet")
    registry.unregister_module("test")


def ended_run(fleet, shard, count=2, name=None):
    """A run that spawned ``count`` creatures on ``shard`` through the runner, then ended."""
    run = start_run(name or f"on {shard}", [{"action": "fleet.spawn", "params": {"shard": shard, "count": count}}])
    advance()  # performs the spawn and the run completes; its cleanup waits for a sweep
    return run


def rows_of(run):
    return list(Resource.objects.filter(run=run, kind="creature").order_by("id"))


def test_a_step_records_its_backend_and_so_do_its_rows(fleet, django_capture_on_commit_callbacks):
    with override_settings(EVENT_REVERT_MAX_ATTEMPTS=3):
        run = start_run("north", [{"action": "fleet.spawn", "params": {"shard": "north", "count": 2}}])
        with django_capture_on_commit_callbacks(execute=False):
            tick()
    assert Step.objects.get(run=run).backend == "north"
    assert {r.backend for r in Resource.objects.filter(run=run)} == {"north"}  # the placeholder too
    assert [c[1] for c in fleet.calls if c[0] == "perform"] == ["north"]


def test_a_backend_the_module_cannot_name_refuses_the_run(fleet):
    fleet.backend_of = lambda params: "north/east"
    with pytest.raises(RunSpecError) as refused:
        start_run("bad", [{"action": "fleet.spawn", "params": {"shard": "north"}}])
    assert "steps[0].params" in refused.value.errors
    assert "without '/'" in refused.value.errors["steps[0].params"]


def test_one_backend_down_holds_only_its_own_rows_and_spends_none_of_their_attempts(fleet):
    north = ended_run(fleet, "north")
    south = ended_run(fleet, "south")
    fleet.down.add("north")

    with override_settings(EVENT_OUTAGE_AFTER=1, EVENT_REVERT_MAX_ATTEMPTS=3):
        sweep()
        sweep()

    assert outages.down_backends() == {("fleet", "north")}
    assert set(states(south).values()) == {"reverted"}, "the other shard is worked as usual"
    assert fleet.worlds["south"] == set()
    assert {r.state for r in rows_of(north)} == {"failed"}
    assert [r.revert_attempts for r in rows_of(north)] == [0, 0], "an outage spends no attempt"


def test_a_down_backend_is_probed_through_its_own_health_and_its_rows_resume(fleet):
    north = ended_run(fleet, "north")
    fleet.down.add("north")
    start = timezone.now()
    with (
        override_settings(EVENT_OUTAGE_AFTER=1, EVENT_OUTAGE_PROBE_S=15, EVENT_OUTAGE_SPREAD_S=0),
        time_machine.travel(start, tick=False) as clock,
    ):
        sweep()
        fleet.down.clear()
        clock.shift(timedelta(seconds=16))
        sweep()  # the probe marks north up; its rows resume at once
        sweep()

    assert [c[1] for c in fleet.calls if c[0] == "health"] == ["north"]
    assert set(states(north).values()) == {"reverted"}
    assert list(ModuleHealth.objects.filter(module="fleet").values_list("backend", "state")) == [("north", "up")]


def test_a_restart_reported_for_one_backend_reconciles_only_its_rows(fleet, django_capture_on_commit_callbacks):
    north = ended_run(fleet, "north")
    south = ended_run(fleet, "south")
    sweep()
    back_north = {r.ref for r in rows_of(north)}
    fleet.worlds["north"] |= back_north  # a rollback brought them back on north only
    fleet.worlds["south"] |= {r.ref for r in rows_of(south)}  # south too, but nobody said it restarted
    fleet.calls.clear()

    with django_capture_on_commit_callbacks(execute=True):
        registry.backend_restarted("fleet", "north")

    assert {c[1] for c in fleet.calls if c[0] == "reconcile"} == {"north"}
    again = Resource.objects.filter(run=north, resurrected_from__isnull=False)
    assert {r.ref for r in again} == back_north
    assert fleet.worlds["north"] == set(), "the resurrected creatures were given back again"
    assert not Resource.objects.filter(run=south, resurrected_from__isnull=False).exists()


def test_an_idle_restart_is_found_through_the_boot_id_and_given_back(fleet, django_capture_on_commit_callbacks):
    run = ended_run(fleet, "north")
    sweep()
    with override_settings(EVENT_BACKEND_WATCH_S=60):
        assert outages.watch() == 1  # the first look: the boot id is only noted
        assert ModuleHealth.objects.get(module="fleet", backend="north").boot_id == "boot-n1"
        fleet.worlds["north"] |= {r.ref for r in rows_of(run)}  # killed after its save...
        fleet.boot["north"] = "boot-n2"  # ...and started again, unseen
        assert outages.watch() == 0, "not due again yet"
        with (
            time_machine.travel(timezone.now() + timedelta(seconds=31), tick=False),
            django_capture_on_commit_callbacks(execute=True),
        ):
            assert outages.watch() == 1

    assert ModuleHealth.objects.get(module="fleet", backend="north").boot_id == "boot-n2"
    assert Resource.objects.filter(run=run, resurrected_from__isnull=False).count() == 2
    assert fleet.worlds["north"] == set()
    assert set(states(run).values()) == {"reverted"}


def test_the_watch_asks_only_backends_that_hold_something(fleet):
    ended_run(fleet, "north")
    with override_settings(EVENT_BACKEND_WATCH_S=60):
        outages.watch()
    assert [c[1] for c in fleet.calls if c[0] == "health"] == ["north"]


def test_a_watch_that_finds_the_backend_down_counts_towards_its_outage(fleet):
    ended_run(fleet, "north")
    fleet.down.add("north")
    with override_settings(EVENT_BACKEND_WATCH_S=60, EVENT_OUTAGE_AFTER=1):
        outages.watch()
    assert outages.down_backends() == {("fleet", "north")}


def test_an_empty_list_revert_goes_to_its_steps_backend(fleet):
    run = make_run()
    step = make_step(run, action_id="fleet.spawn", backend="south")
    make_rows(step, [], module="fleet")  # only the placeholder: the worker died before recording
    Resource.objects.filter(run=run).update(backend="south")

    sweep()

    assert [(c[0], c[1], c[2]["refs"]) for c in fleet.calls] == [("revert", "south", [])]
    assert set(states(run).values()) == {"reverted"}


def test_one_steps_rows_on_two_backends_are_two_calls(fleet):
    run = make_run()
    step = make_step(run, action_id="fleet.spawn", backend="north")
    make_rows(step, ["a", "b", "c"], module="fleet", placeholder=False)
    Resource.objects.filter(run=run).update(backend="north")
    Resource.objects.filter(run=run, ref="c").update(backend="south")

    sweep()

    calls = sorted((c[1], tuple(c[2]["refs"])) for c in fleet.calls if c[0] == "revert")
    assert calls == [("north", ("a", "b")), ("south", ("c",))]
    assert set(states(run).values()) == {"reverted"}


def test_max_concurrency_is_per_backend():
    in_flight, peak, lock = {}, {}, threading.Lock()

    class Slow(Fleet):
        max_concurrency = 1

        def revert(self, *, run_id, resources, idempotency_key, backend):
            with lock:
                in_flight[backend] = in_flight.get(backend, 0) + 1
                peak["all"] = max(peak.get("all", 0), sum(in_flight.values()))
                peak[backend] = max(peak.get(backend, 0), in_flight[backend])
            time.sleep(0.05)
            with lock:
                in_flight[backend] -= 1
            return {"ok": True, "failed": []}

    registry.register_action(Slow())
    try:
        run = make_run()
        for shard in ("north", "south", "north", "south"):
            step = make_step(run, action_id="fleet.spawn", backend=shard)
            make_rows(step, [f"{shard}-{step.pk}"], module="fleet", placeholder=False)
            Resource.objects.filter(step=step).update(backend=shard)
        sweep()
    finally:
        registry.unregister_module("fleet")

    assert set(states(run).values()) == {"reverted"}
    assert (peak["north"], peak["south"]) == (1, 1), "one call at a time on each backend"
    assert peak["all"] == 2, "but the two backends are called at the same time"


def test_a_lease_the_backend_forgot_is_orphaned_and_its_stack_still_restores_the_first_baseline():
    lease = FakeLease(values={"camp": 1})
    registry.register_lease(lease)
    try:
        first = make_lease_row(make_run(status="running"), baseline=1, applied=3)
        second = make_lease_row(make_run(status="running"), baseline=3, applied=5)
        # The server restarted and lost the newer override: the older one's 3 is in force.
        lease.values["camp"] = 3
        summary = reconcile_module("test", restarted=True)
        assert summary.forgotten == 1
        second.refresh_from_db()
        first.refresh_from_db()
        assert second.state == ResourceState.ORPHANED
        assert second.last_error == "the backend no longer holds this override"
        assert second.run.log.filter(kind="resource.orphaned").exists()
        assert first.state == ResourceState.LIVE

        # Both forgotten: the value is back at the first baseline.
        third = make_lease_row(make_run(status="running"), baseline=3, applied=7)
        lease.values["camp"] = 1
        assert reconcile_module("test", restarted=True).forgotten == 2
        first.refresh_from_db()
        third.refresh_from_db()
        assert (first.state, third.state) == (ResourceState.ORPHANED, ResourceState.ORPHANED)
        assert third.payload["baseline"] == 1, "the first baseline was handed down the stack"
    finally:
        registry.unregister_module("test")


def test_a_stack_still_in_force_is_left_alone_and_a_lost_one_resolves_without_a_restore():
    lease = FakeLease(values={"camp": 1})
    registry.register_lease(lease)
    try:
        first = make_lease_row(make_run(status="running"), baseline=1, applied=3)
        second = make_lease_row(make_run(status="running"), baseline=3, applied=5)
        lease.values["camp"] = 5  # the newest override survived the restart: both hold
        assert reconcile_module("test", restarted=True).forgotten == 0
        lease.values["camp"] = 1  # the configured value is back: the whole stack is gone
        assert reconcile_module("test", restarted=True).forgotten == 2
        first.refresh_from_db()
        second.refresh_from_db()
        assert (first.state, second.state) == (ResourceState.ORPHANED, ResourceState.ORPHANED)
        assert second.payload["baseline"] == 1, "the first baseline went down the stack"
        assert lease.restores == [], "nothing was restored over a value nobody holds"
    finally:
        registry.unregister_module("test")


def dead_claim(attempts, called):
    """A row on north that a sweeper claimed, its attempts counted, then died holding,
    before its call (``called`` False) or in it."""
    run = make_run()
    step = make_step(run, action_id="fleet.spawn", backend="north")
    make_rows(step, ["a"], module="fleet", placeholder=False)
    past = timezone.now() - timedelta(minutes=5)
    Resource.objects.filter(run=run).update(
        backend="north",
        state=ResourceState.REVERTING,
        revert_attempts=attempts,
        claim_expires_at=past,
        claim_called=called,
    )
    return run


def test_a_claim_taken_over_before_its_call_gives_its_attempt_back(fleet):
    run = dead_claim(attempts=1, called=False)

    sweep()

    row = Resource.objects.get(run=run)
    assert (row.state, row.revert_attempts) == ("reverted", 1), "one call, one attempt"
    # Its history, as staff read it, numbers the one call (the give-back is the row's own record).
    assert [a.number for a in rows.history(row, Attempt.objects.filter(resource=row))] == [1]


def test_a_claim_taken_over_after_its_call_keeps_the_attempt_it_spent(fleet):
    run = dead_claim(attempts=1, called=True)

    sweep()

    row = Resource.objects.get(run=run)
    assert (row.state, row.revert_attempts) == ("reverted", 2)


def test_a_dead_uncalled_claim_at_the_ceiling_is_tried_again_not_failed(fleet):
    run = dead_claim(attempts=3, called=False)

    with override_settings(EVENT_REVERT_MAX_ATTEMPTS=3):
        sweep()

    row = Resource.objects.get(run=run)
    assert (row.state, row.revert_attempts) == ("reverted", 3)


@pytest.mark.django_db(transaction=True)  # the call reads the rows from a connection of its own
def test_the_calls_of_a_pass_mark_their_rows_called_before_they_start(fleet):
    seen = []
    original = fleet.revert

    def revert(**kwargs):
        seen.extend(
            Resource.objects.filter(ref__in=[r["ref"] for r in kwargs["resources"]]).values_list(
                "claim_called", flat=True
            )
        )
        return original(**kwargs)

    fleet.revert = revert
    run = make_run()
    step = make_step(run, action_id="fleet.spawn", backend="north")
    make_rows(step, ["a", "b"], module="fleet", placeholder=False)
    Resource.objects.filter(run=run).update(backend="north")

    sweep()

    assert seen == [True, True]
    assert set(states(run).values()) == {"reverted"}


def test_the_tick_watches_the_backends_but_a_busy_site_looks_at_most_every_few_seconds(fleet, monkeypatch):
    from cleanup import runner

    ended_run(fleet, "north")
    looks = []
    monkeypatch.setattr(runner.outages, "watch", lambda: looks.append(1) or 0)
    monkeypatch.setitem(runner._last_watch, "at", None)
    tick()
    tick()
    assert looks == [1]
    monkeypatch.setitem(runner._last_watch, "at", time.monotonic() - runner.WATCH_EVERY_S)
    tick()
    assert looks == [1, 1]


@pytest.mark.django_db(transaction=True)
def test_a_verdict_being_written_holds_off_a_mark_down_until_its_attempts_can_be_forgiven():
    """Two passes race an outage: one writes verdicts that blamed the backend while the other
    counts the answer that marks it down. The mark-down must forgive what the first spent."""
    from django.db import connections, transaction

    run = make_run()
    step = make_step(run, action_id="fleet.spawn", backend="north")
    [row] = make_rows(step, ["a"], module="fleet", placeholder=False)
    Resource.objects.filter(pk=row.pk).update(backend="north", state="reverting", revert_attempts=1)
    outages.record("fleet", "refused", backend="north")  # the streak began; one more marks it down
    locked, marked = threading.Event(), []

    def first_pass():  # writes a blamed verdict: the attempt counted, as the backend looked up
        try:
            with transaction.atomic():
                outages.lock_health([("fleet", "north")])
                assert outages.waiting_until("fleet", backend="north") is None
                locked.set()
                time.sleep(0.5)  # the other pass counts its answer meanwhile
                Resource.objects.filter(pk=row.pk).update(state="failed")
                Attempt.record([Resource.objects.get(pk=row.pk)], outages.UNAVAILABLE, "refused")
        finally:
            connections.close_all()

    def second_pass():
        try:
            locked.wait(5)
            marked.append(outages.record("fleet", "refused", backend="north"))
        finally:
            connections.close_all()

    with override_settings(EVENT_OUTAGE_AFTER=2):
        threads = [threading.Thread(target=first_pass), threading.Thread(target=second_pass)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)

    assert marked == [True]
    row.refresh_from_db()
    assert row.revert_attempts == 0, "the mark-down waited for the verdict, then forgave its attempt"
