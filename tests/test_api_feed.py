"""The change feed: the run log and the modules' log in one increasing sequence, read or waited on."""

import threading
import time

import pytest
from django.db import connection, connections, transaction

from cleanup import feed
from cleanup.api import feed as feed_view
from cleanup.api.feed import position
from cleanup.models import ModuleEvent, RunLog, RunStatus
from cleanup.runner import cancel_run
from tests.fakes import make_run
from tests.test_api_access import API, api_as

CHANGES = API + "changes/"


@pytest.fixture
def console():
    return api_as("view_runlog", "view_moduleevent", "view_run")


def module_event(kind="module.down", module="sandbox", backend="north", **detail):
    return ModuleEvent.objects.create(module=module, backend=backend, kind=kind, detail=detail)


@pytest.mark.django_db
def test_the_feed_lists_both_logs_in_the_order_they_were_written(console):
    run = make_run(status=RunStatus.RUNNING, name="raid")
    RunLog.write(run.pk, "run.started", by="ann")
    module_event("module.down", reason="no answer")
    RunLog.write(run.pk, "step.waiting", position=0)
    module_event("module.up")
    entries = console.get(CHANGES).json()
    assert [(e["kind"], e["source"], e["run"], e["module"]) for e in entries] == [
        ("run.started", "run", run.pk, None),
        ("module.down", "module", None, "sandbox"),
        ("step.waiting", "run", run.pk, None),
        ("module.up", "module", None, "sandbox"),
    ]
    ids = [e["id"] for e in entries]
    assert ids == sorted(set(ids)), "ids increase and are never shared"
    assert entries[1]["backend"] == "north" and entries[1]["detail"] == {"reason": "no answer"}
    assert entries[0]["at"].endswith(("Z", "+00:00"))
    later = console.get(CHANGES, {"after": ids[1], "limit": 1})
    assert [e["kind"] for e in later.json()] == ["step.waiting"]
    assert f"after={ids[2]}" in later["Link"]


@pytest.mark.django_db
def test_position_is_the_highest_id_and_what_follows_is_listed_after_it(console):
    run = make_run(status=RunStatus.RUNNING)
    RunLog.write(run.pk, "run.started")
    before = position()
    assert before == console.get(CHANGES).json()[-1]["id"]
    assert console.get(CHANGES, {"after": before}).json() == []
    RunLog.write(run.pk, "run.cancelled", by="ann")
    assert position() > before
    assert [e["kind"] for e in console.get(CHANGES, {"after": before}).json()] == ["run.cancelled"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query, field",
    [({"after": "abc"}, "after"), ({"after": "-1"}, "after"), ({"limit": "0"}, "limit"), ({"limit": "501"}, "limit")]
    + [({"wait": "31"}, "wait"), ({"wait": "1.5"}, "wait")],
)
def test_a_bad_value_is_refused_naming_it(console, query, field):
    answer = console.get(CHANGES, query)
    assert answer.status_code == 400
    assert field in str(answer.json())


@pytest.mark.django_db
def test_the_feed_needs_both_logs_permissions():
    assert api_as("view_runlog", username="half").get(CHANGES).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_an_entry_committed_late_is_listed_after_what_was_already_read(console):
    """A long transaction's entry takes its id first but commits last: a reader that read on
    from the highest id it saw still gets it."""
    run = make_run(status=RunStatus.RUNNING)
    written, release = threading.Event(), threading.Event()

    def slow_writer():
        try:
            with transaction.atomic():
                RunLog.write(run.pk, "step.performed", position=0)  # the lower row id
                written.set()
                release.wait(10)
        finally:
            connections.close_all()

    writer = threading.Thread(target=slow_writer)
    writer.start()
    assert written.wait(10)
    RunLog.write(run.pk, "run.cancelled")  # a higher row id, committed first
    seen = console.get(CHANGES).json()
    assert [e["kind"] for e in seen] == ["run.cancelled"]
    release.set()
    writer.join(10)
    late = console.get(CHANGES, {"after": seen[-1]["id"]}).json()
    assert [e["kind"] for e in late] == ["step.performed"]
    everything = console.get(CHANGES).json()
    assert [e["kind"] for e in everything] == ["run.cancelled", "step.performed"]


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_is_answered_when_a_run_ends_without_holding_a_connection(console, monkeypatch):
    run = make_run(status=RunStatus.RUNNING, name="raid")
    since = position()
    looks = []

    def watched_pause(seconds):
        looks.append(connection.connection is None)
        time.sleep(seconds)

    monkeypatch.setattr(feed_view, "pause", watched_pause)

    def end_the_run():
        try:
            time.sleep(1)
            cancel_run(run.pk, cleanup=False, actor="ann")
        finally:
            connections.close_all()

    ender = threading.Thread(target=end_the_run)
    started = time.monotonic()
    ender.start()
    answer = console.get(CHANGES, {"after": since, "wait": 20})
    took = time.monotonic() - started
    ender.join(10)
    assert answer.status_code == 200
    assert "run.cancelled" in [e["kind"] for e in answer.json()]
    assert all(e["run"] == run.pk for e in answer.json())
    assert took < 15, "answered when the run ended, not when the wait did"
    assert looks and all(looks), "no connection is held while the request waits"


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_with_nothing_happening_answers_an_empty_list_when_the_wait_ends(console):
    since = position()
    started = time.monotonic()
    answer = console.get(CHANGES, {"after": since, "wait": 1})
    assert (answer.status_code, answer.json()) == (200, [])
    assert time.monotonic() - started >= 1


@pytest.mark.django_db
def test_a_burst_larger_than_a_stamp_is_placed_in_order_over_several_reads(console, monkeypatch):
    monkeypatch.setattr(feed, "STAMP_BATCH", 3)
    run = make_run(status=RunStatus.RUNNING)
    for n in range(7):
        RunLog.write(run.pk, "step.performed", position=n)
    seen, after = [], 0
    for _ in range(10):
        page = console.get(CHANGES, {"after": after}).json()
        if not page:
            break
        seen += [e["detail"]["position"] for e in page]
        after = page[-1]["id"]
    assert seen == list(range(7))
