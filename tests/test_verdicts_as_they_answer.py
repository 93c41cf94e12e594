"""A batch's verdicts are written as its calls answer (rule 9), not once after all its waves,
so a sweeper killed mid-batch gives back again only what was in flight; a dead sweeper's
suspects are taken over together, each called alone (rule 20); and a pass outlives a lost
database connection at any of its statements (rule 27)."""

import threading
import time
import uuid

import pytest
from django.db import OperationalError, connection, connections
from django.test import override_settings

from cleanup import clock, registry
from cleanup.models import Resource, ResourceState
from cleanup.sweep import reconnect, sweep, verdicts
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_outage_yet(monkeypatch):
    """Each test starts with no database outage known to this process (`reconnect`)."""
    monkeypatch.setitem(reconnect._outage, "since", None)


def states_seen_from_another_connection(refs):
    """The rows' states as every other sweeper sees them: what was committed."""
    try:
        return dict(Resource.objects.filter(ref__in=refs).values_list("ref", "state"))
    finally:
        connections.close_all()  # the call's thread keeps no connection


@override_settings(EVENT_CALL_CONCURRENCY=1)
def test_the_first_waves_verdicts_are_written_while_the_last_wave_still_runs():
    run = make_run()
    for n in range(3):
        make_rows(make_step(run), [f"orc-{n}"], placeholder=False)
    seen = {}

    def revert(*, run_id, resources, idempotency_key):
        ref = resources[0]["ref"]
        if ref == "orc-2":  # the last wave, a while after the others answered: what would a kill now leave?
            time.sleep(0.5)
            seen.update(states_seen_from_another_connection(["orc-0", "orc-1"]))
        time.sleep(0.05)
        return {"ok": True}

    registry.register_action(FakeAction(revert=revert))

    sweep()

    assert seen == {"orc-0": ResourceState.REVERTED, "orc-1": ResourceState.REVERTED}
    assert set(Resource.objects.filter(run=run).values_list("state", flat=True)) == {ResourceState.REVERTED}


@override_settings(EVENT_CALL_CONCURRENCY=4)
def test_answers_of_one_wave_are_written_within_a_moment_while_its_slow_calls_run():
    run = make_run()
    for n in range(4):
        make_rows(make_step(run), [f"orc-{n}"], placeholder=False)
    slow_started = threading.Event()
    seen = {}

    def revert(*, run_id, resources, idempotency_key):
        ref = resources[0]["ref"]
        if ref == "orc-3":
            slow_started.set()
            time.sleep(1.5)  # the others answered long ago: their verdicts are written by now
            seen.update(states_seen_from_another_connection(["orc-0", "orc-1", "orc-2"]))
        return {"ok": True}

    registry.register_action(FakeAction(revert=revert))

    sweep()

    assert slow_started.is_set()
    assert seen == {f"orc-{n}": ResourceState.REVERTED for n in range(3)}


def dead_sweepers_batch(run, groups):
    """The rows a sweeper killed from outside left: claimed together, marked called
    together (shared), their claim run out."""
    token = uuid.uuid4()
    for n in range(groups):
        make_rows(make_step(run), [f"orc-{n}"], placeholder=False)
    Resource.objects.filter(run=run).update(
        state=ResourceState.REVERTING,
        claim_token=token,
        claim_expires_at=clock.after(-1),
        claim_called=True,
        claim_shared=True,
        revert_attempts=1,
    )


@override_settings(EVENT_CALL_CONCURRENCY=8)
def test_a_dead_sweepers_shared_claim_is_taken_over_in_one_pass_its_groups_called_together():
    run = make_run()
    dead_sweepers_batch(run, groups=6)
    in_flight, most, lock = [0], [0], threading.Lock()
    claims_seen = []

    def revert(*, run_id, resources, idempotency_key):
        # What a kill now would leave: suspects taken over together, marked with their wave.
        claims_seen.append(
            set(
                Resource.objects.filter(ref=resources[0]["ref"]).values_list(
                    "claim_called", "claim_shared", "claim_suspect"
                )
            )
        )
        connections.close_all()
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.2)
        with lock:
            in_flight[0] -= 1
        return {"ok": True}

    registry.register_action(FakeAction(revert=revert))

    result = sweep()

    assert result.summary.reverted == 6, "the dead sweeper's groups were taken over one a pass"
    assert set(Resource.objects.filter(run=run).values_list("state", flat=True)) == {ResourceState.REVERTED}
    assert all(seen == {(True, True, True)} for seen in claims_seen), claims_seen
    assert most[0] > 1, "the suspects were called one after another, not concurrently"
    # Each taken over from a claim marked with others: its attempt given back, none spent by the dead one.
    assert set(Resource.objects.filter(run=run).values_list("revert_attempts", flat=True)) == {1}


@override_settings(EVENT_CALL_CONCURRENCY=8)
def test_suspects_whose_takeover_died_too_are_worked_one_at_a_time_each_spending_its_own_attempt():
    run = make_run()
    dead_sweepers_batch(run, groups=3)
    Resource.objects.filter(run=run).update(claim_suspect=True)  # the takeover of them died as well
    revert = Scripted({"ok": True})
    registry.register_action(FakeAction(revert=revert))

    first = sweep()

    assert first.summary.reverted == 1 and len(revert.calls) == 1, "a suspect that may be a pill was not alone"
    [given_back] = Resource.objects.filter(run=run, state=ResourceState.REVERTED)
    assert given_back.revert_attempts == 1 and not given_back.claim_shared
    for _ in range(2):
        sweep()
    assert set(Resource.objects.filter(run=run).values_list("state", flat=True)) == {ResourceState.REVERTED}
    assert len(revert.calls) == 3


def terminate_own_connection():
    """PostgreSQL ends this process's session, as a restart of the server does."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with _other() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


class _other:
    """A cursor on a second, short-lived connection."""

    def __enter__(self):
        import psycopg

        settings_dict = connection.settings_dict
        self.conn = psycopg.connect(
            host=settings_dict.get("HOST") or "127.0.0.1",
            port=settings_dict.get("PORT") or 5432,
            user=settings_dict.get("USER") or "postgres",
            dbname=settings_dict["NAME"],
            autocommit=True,
        )
        return self.conn.cursor()

    def __exit__(self, *exc):
        self.conn.close()


def test_a_pass_whose_connection_was_ended_before_its_first_query_goes_on(caplog):
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    registry.register_action(FakeAction(revert=Scripted({"ok": True})))
    terminate_own_connection()

    result = sweep()

    assert result.summary.reverted == 1
    assert Resource.objects.get(run=run).state == ResourceState.REVERTED
    lost = [r for r in caplog.records if "connection was lost" in r.getMessage()]
    assert len(lost) == 1, "the outage is logged once"


def test_a_verdict_whose_write_loses_the_database_twice_is_written_by_the_same_pass(monkeypatch):
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2"], placeholder=False)
    revert = Scripted({"ok": True})
    registry.register_action(FakeAction(revert=revert))
    write, failures = verdicts.write, [2]

    def write_losing_the_database(*args, **kwargs):
        if failures[0]:
            failures[0] -= 1
            terminate_own_connection()
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")  # raises: the server ended the session
        return write(*args, **kwargs)

    monkeypatch.setattr(verdicts, "write", write_losing_the_database)

    sweep()

    assert failures == [0]
    assert set(Resource.objects.filter(run=run).values_list("state", flat=True)) == {ResourceState.REVERTED}
    assert len(revert.calls) == 1, "the rows were called again"


def test_a_pass_whose_database_stays_away_ends_quietly_with_work_left(monkeypatch):
    monkeypatch.setattr(reconnect, "READ_FOR_S", 0.3)

    def lost(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    from cleanup.sweep import claims

    monkeypatch.setattr(claims, "look", lost)

    result = sweep()

    assert result.work_left and result.runs == 0


def test_a_task_that_lost_its_database_ends_with_a_line_not_a_traceback(monkeypatch, caplog):
    from cleanup import runner, tasks

    def tick(**kwargs):
        raise OperationalError("terminating connection due to administrator command")

    monkeypatch.setattr(runner, "tick", tick)

    line = tasks.tick_task()

    assert "the database was lost" in line
    assert [r for r in caplog.records if "connection was lost" in r.getMessage()]
