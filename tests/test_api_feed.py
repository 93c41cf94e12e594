"""The change feed: the run log and the modules' log in one increasing sequence, read or waited on."""

import asyncio
import json
import threading
import time

import psycopg
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, connections, transaction
from django.test import AsyncClient

from cleanup import feed
from cleanup.api import waiting
from cleanup.api.feed import position
from cleanup.api.tokens import issue
from cleanup.models import ModuleEvent, RunLog, RunStatus
from cleanup.runner import cancel_run
from tests.fakes import make_run
from tests.test_api_access import API, api_as, user_with

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


def backend_alive(pid):
    """Whether the PostgreSQL backend ``pid`` is still connected (asked on a connection of its own)."""
    with psycopg.connect(waiting.conninfo(), autocommit=True) as own:
        return own.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0] == 1


@pytest.mark.django_db(transaction=True)
def test_a_long_poll_is_answered_when_a_run_ends_without_holding_a_connection(console):
    run = make_run(status=RunStatus.RUNNING, name="raid")
    since = position()
    connection.ensure_connection()
    request_pid = connection.connection.info.backend_pid
    held = []

    def end_the_run():
        try:
            time.sleep(1.5)
            held.append(backend_alive(request_pid))
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
    assert took < 10, "answered when the run ended (told by PostgreSQL), not when the wait did"
    assert held == [False], "the request's connection was given back before it waited"
    assert f"after={answer.json()[-1]['id']}" in answer["Link"]


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


# -- the event stream and the filters ------------------------------------------------------


def follow(key, count, headers=None, query=None, during=None):
    """Follow the feed as an event stream until ``count`` events came: ``[(id, entry)]``;
    ``during`` is called once the stream is open."""

    async def run():
        asked = {"Authorization": f"Token {key}", "Accept": "text/event-stream", **(headers or {})}
        response = await AsyncClient().get(CHANGES, query or {}, headers=asked)
        assert response.status_code == 200, response.content
        assert response["Content-Type"].startswith("text/event-stream")
        assert "no-store" in response["Cache-Control"]
        chunks = aiter(response.streaming_content)
        if during is not None:
            await sync_to_async(during)()
        events, buffer = [], ""
        async with asyncio.timeout(15):
            while len(events) < count:
                chunk = await anext(chunks)
                buffer += chunk.decode() if isinstance(chunk, bytes) else chunk
                while "\n\n" in buffer:
                    block, buffer = buffer.split("\n\n", 1)
                    fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
                    if fields.get("event") == "change":
                        events.append((int(fields["id"]), json.loads(fields["data"])))
        await chunks.aclose()
        return events

    return async_to_sync(run)()


def token(*codenames, username="follower"):
    return issue(user_with(*codenames, username=username))[1]


@pytest.mark.django_db(transaction=True)
def test_the_event_stream_tells_each_change_as_it_happens_from_now():
    run = make_run(status=RunStatus.RUNNING, name="raid")
    RunLog.write(run.pk, "run.started")  # before the stream: not told
    key = token("view_runlog", "view_moduleevent")
    events = follow(
        key, 2, during=lambda: (RunLog.write(run.pk, "step.waiting", position=0), module_event("module.up"))
    )
    assert [(e["kind"], e["source"]) for _, e in events] == [("step.waiting", "run"), ("module.up", "module")]
    assert [i for i, _ in events] == [e["id"] for _, e in events]


@pytest.mark.django_db(transaction=True)
def test_the_event_stream_resumes_after_its_last_event_id():
    run = make_run(status=RunStatus.RUNNING)
    first = RunLog.write(run.pk, "run.started")
    RunLog.write(run.pk, "step.waiting", position=0)
    RunLog.write(run.pk, "run.cancelled")
    feed.stamp()
    first.refresh_from_db()
    key = token("view_runlog", "view_moduleevent")
    events = follow(key, 2, headers={"Last-Event-ID": str(first.seq)})
    assert [e["kind"] for _, e in events] == ["step.waiting", "run.cancelled"]


@pytest.mark.django_db(transaction=True)
def test_an_event_stream_behind_a_backlog_of_many_batches_reads_it_at_once(monkeypatch):
    """A console resuming from long ago: the backlog, older than the listener's memory, comes
    a batch after another, not a batch per change (nothing changes here; a wait for one
    would last the fallback's time, made longer than the follower's patience)."""
    monkeypatch.setattr(waiting, "FALLBACK_S", 60.0)
    monkeypatch.setattr(waiting, "KEEP", 2)  # the listener holds less than the backlog
    run = make_run(status=RunStatus.RUNNING)
    start = position()
    for n in range(9):
        RunLog.write(run.pk, "step.performed", position=n)
    feed.stamp()
    key = token("view_runlog", "view_moduleevent")
    events = follow(key, 9, query={"after": start, "limit": 2})  # gives up after 15 s
    assert [e["detail"]["position"] for _, e in events] == list(range(9))


@pytest.mark.django_db(transaction=True)
def test_the_event_stream_is_refused_as_the_apis_json_without_the_permissions():
    async def ask():
        asked = {"Authorization": f"Token {key}", "Accept": "text/event-stream"}
        return await AsyncClient().get(CHANGES, headers=asked)

    key = token("view_runlog")
    answer = async_to_sync(ask)()
    assert answer.status_code == 403
    assert answer["Content-Type"] == "application/json"
    assert answer.json()["code"] == "permission_denied"


@pytest.mark.django_db
def test_the_feed_is_narrowed_to_a_run_and_to_kinds(console):
    raid, other = make_run(status=RunStatus.RUNNING), make_run(status=RunStatus.RUNNING)
    RunLog.write(raid.pk, "run.started")
    RunLog.write(other.pk, "run.started")
    module_event("module.down")
    RunLog.write(raid.pk, "run.cancelled")
    assert [e["kind"] for e in console.get(CHANGES, {"run": raid.pk}).json()] == ["run.started", "run.cancelled"]
    assert [(e["kind"], e["run"]) for e in console.get(CHANGES, {"kind": "run.started,module.down"}).json()] == [
        ("run.started", raid.pk),
        ("run.started", other.pk),
        ("module.down", None),
    ]
    refused = console.get(CHANGES, {"kind": "run.exploded"})
    assert refused.status_code == 400 and "kind" in refused.json()["errors"]


# -- rendering once, and the listener's memory from its start ------------------------------


@pytest.mark.django_db
def test_an_entry_is_rendered_as_the_serializer_and_the_json_renderer_would_and_once():
    from rest_framework.renderers import JSONRenderer

    from cleanup.api import feed as api_feed

    run = make_run(status=RunStatus.RUNNING)
    RunLog.write(run.pk, "run.started", by="ann", note="ünïcode \u2028 line", module="sandbox")
    module_event("module.down", reason="no answer", backend="north")
    entries = feed.entries_after(0, 10)
    assert len(entries) == 2
    for entry in entries:
        assert api_feed.change_data(dict(entry)) == api_feed.ChangeSerializer(entry).data
    expected = JSONRenderer().render(api_feed.ChangeSerializer(entries, many=True).data)
    assert api_feed.rendered(entries) == expected
    calls = []
    original = api_feed.change_data
    api_feed.change_data = lambda entry: calls.append(entry["id"]) or original(entry)
    try:
        assert api_feed.rendered(entries) == expected
        assert calls == []  # the list again: from what each entry kept
        fresh = feed.entries_after(0, 10)
        told = [api_feed.event(entry) for entry in entries]
        assert [api_feed.event(entry) for entry in entries] == told == [api_feed.event(e) for e in fresh]
    finally:
        api_feed.change_data = original
    # Each event rendered once per entry object: the held ones once, the fresh copies once.
    assert sorted(calls) == sorted([e["id"] for e in entries] * 2)
    assert told[0].startswith(f"id: {entries[0]['id']}\nevent: change\ndata: {{")


@pytest.mark.django_db(transaction=True)
def test_the_listener_holds_the_feeds_last_places_from_its_start(monkeypatch):
    """A console a little behind when a process starts (listed, then follows) is answered from
    memory: the listener reads the last `KEEP` places first."""
    monkeypatch.setattr(waiting, "KEEP", 5)
    run = make_run(status=RunStatus.RUNNING)
    for n in range(8):
        RunLog.write(run.pk, "step.performed", position=n)
    feed.stamp()
    last = position()
    read = []
    monkeypatch.setattr(waiting, "read_feed", lambda *args: read.append(args) or [])

    async def listen():
        hub = waiting.hub()
        async with asyncio.timeout(10):
            while not hub.ready:
                await asyncio.sleep(0.01)
        held = [e["detail"]["position"] for e in hub.entries]
        behind = await waiting.wait_for_entries(last - 3, 100, None, None, 1)
        hub.task.cancel()
        return hub.floor, held, [e["detail"]["position"] for e in behind]

    floor, held, behind = async_to_sync(listen)()
    assert (floor, held, behind) == (last - 5, [3, 4, 5, 6, 7], [5, 6, 7])
    assert read == []  # nothing read from the database for it
