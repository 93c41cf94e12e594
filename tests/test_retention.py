"""Retention: runs past the window are deleted with what they own; nothing else is."""

import gzip
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import Schedule

from cleanup.models import (
    Alert,
    AlertedStatus,
    Attempt,
    CleanupStatus,
    ModuleEvent,
    Resource,
    ResourceState,
    Run,
    RunLog,
    RunStatus,
    Step,
)
from cleanup.retention import Archive, prune
from cleanup.tasks import PRUNE_SCHEDULE_NAME, ensure_schedule, prune_task
from tests.fakes import make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

NOW = timezone.now()


def ended_run(days_ago, cleanup=CleanupStatus.COMPLETE, state=ResourceState.REVERTED, refs=("a", "b"), **fields):
    """A run that ended ``days_ago`` with its steps, rows in ``state``, an attempt each and a log entry."""
    run = make_run(status=RunStatus.COMPLETED, cleanup_status=cleanup, **fields)
    Run.objects.filter(pk=run.pk).update(ended_at=NOW - timedelta(days=days_ago))
    step = make_step(run)
    for row in make_rows(step, refs):
        Resource.objects.filter(pk=row.pk).update(state=state)
        Attempt.objects.create(resource=row, run=run, number=1, outcome="reverted")
    RunLog.write(run.pk, "run.completed")
    return Run.objects.get(pk=run.pk)


def owned(run_id):
    return {
        "steps": Step.objects.filter(run_id=run_id).count(),
        "resources": Resource.objects.filter(run_id=run_id).count(),
        "attempts": Attempt.objects.filter(run_id=run_id).count(),
        "log": RunLog.objects.filter(run_id=run_id).count(),
    }


def test_a_run_past_the_window_is_deleted_with_everything_it_owns():
    old = ended_run(100)
    Alert.objects.create(run=old, event="cleanup.recovered", channel="mail", payload={}, sent_at=NOW)
    result = prune(days=90)
    assert not Run.objects.filter(pk=old.pk).exists()
    assert owned(old.pk) == {"steps": 0, "resources": 0, "attempts": 0, "log": 0}
    assert not Alert.objects.filter(run_id=old.pk).exists()
    assert (result.runs, result.steps, result.resources, result.attempts, result.log) == (1, 1, 3, 3, 1)


def test_runs_inside_the_window_or_still_running_are_kept():
    young = ended_run(10)
    running = make_run(status=RunStatus.RUNNING)
    prune(days=90)
    assert Run.objects.filter(pk__in=[young.pk, running.pk]).count() == 2
    assert owned(young.pk)["resources"] == 3


@pytest.mark.parametrize(
    "state", [ResourceState.LIVE, ResourceState.FAILED, ResourceState.DRIFTED, ResourceState.REVERTING]
)
def test_a_run_with_any_unresolved_row_is_never_pruned(state):
    run = ended_run(400, cleanup=CleanupStatus.COMPLETE, refs=("a", "b"))
    Resource.objects.filter(run=run, ref="b").update(state=state)
    prune(days=90)
    assert Run.objects.filter(pk=run.pk).exists()
    assert owned(run.pk)["resources"] == 3


@pytest.mark.parametrize("cleanup", [CleanupStatus.PENDING, CleanupStatus.INCOMPLETE])
def test_a_run_a_person_asked_to_clean_or_that_gave_up_is_kept(cleanup):
    run = ended_run(400, cleanup=cleanup, state=ResourceState.WAIVED)
    prune(days=90)
    assert Run.objects.filter(pk=run.pk).exists()


def test_a_run_whose_recovery_staff_were_not_told_of_is_kept():
    untold = ended_run(400, alerted_status=AlertedStatus.GAVE_UP)
    unsent = ended_run(400)
    Alert.objects.create(run=unsent, event="cleanup.recovered", channel="mail", payload={})
    prune(days=90)
    assert Run.objects.filter(pk__in=[untold.pk, unsent.pk]).count() == 2


def test_zero_days_keeps_everything():
    run = ended_run(10_000)
    assert prune(days=0).runs == 0
    assert Run.objects.filter(pk=run.pk).exists()


def test_a_row_recorded_again_in_a_kept_run_forgets_the_pruned_row_it_came_from():
    old = ended_run(200)
    source = Resource.objects.filter(run=old, ref="a").get()
    keep = ended_run(1)
    again = Resource.objects.filter(run=keep, ref="a").get()
    Resource.objects.filter(pk=again.pk).update(resurrected_from=source)
    prune(days=90)
    again.refresh_from_db()
    assert again.resurrected_from_id is None
    assert not Resource.objects.filter(pk=source.pk).exists()


def test_batches_are_bounded_and_their_queries_do_not_grow_with_the_rows():
    for _ in range(5):
        ended_run(200, refs=[f"r{i}" for i in range(3)])
    with CaptureQueriesContext(connection) as small:
        first = prune(days=90, batch=2, max_batches=1)
    assert first.runs == 2 and first.batches == 1
    for _ in range(2):
        ended_run(200, refs=[f"r{i}" for i in range(60)])
    with CaptureQueriesContext(connection) as big:
        second = prune(days=90, batch=2, max_batches=1)
    assert second.runs == 2
    # Two runs of 61 rows cost what two runs of 4 rows did: no statement per row.
    assert len(big.captured_queries) == len(small.captured_queries)
    rest = prune(days=90, batch=2)
    assert rest.runs == 3 and rest.batches == 2
    assert not Run.objects.exists()


def test_a_dry_run_changes_nothing_and_says_what_it_would_delete():
    old = ended_run(200)
    ModuleEvent.objects.create(module="test", kind="module.down", at=NOW - timedelta(days=200), alerted_at=NOW)
    result = prune(days=90, dry_run=True)
    assert (result.runs, result.resources, result.module_events) == (1, 3, 1)
    assert Run.objects.filter(pk=old.pk).exists() and owned(old.pk)["resources"] == 3
    assert ModuleEvent.objects.count() == 1
    out = _command("prune", "--dry-run", "--older-than", "90")
    assert out.startswith("would delete 1 run(s)")
    assert Run.objects.filter(pk=old.pk).exists()


def test_the_modules_log_and_sent_alerts_are_bounded_too():
    long_ago = NOW - timedelta(days=200)
    told = ModuleEvent.objects.create(module="test", kind="module.down", at=long_ago, alerted_at=long_ago)
    untold = ModuleEvent.objects.create(module="test", kind="module.up", at=long_ago)
    recent = ModuleEvent.objects.create(module="test", kind="module.down", alerted_at=NOW)
    sent = Alert.objects.create(module="test", event="module.down", channel="mail", payload={}, sent_at=long_ago)
    unsent = Alert.objects.create(module="test", event="module.up", channel="mail", payload={})
    result = prune(days=90)
    assert set(ModuleEvent.objects.values_list("pk", flat=True)) == {untold.pk, recent.pk}
    assert not ModuleEvent.objects.filter(pk=told.pk).exists()
    assert set(Alert.objects.values_list("pk", flat=True)) == {unsent.pk}
    assert not Alert.objects.filter(pk=sent.pk).exists()
    assert result.module_events == 1


@pytest.mark.parametrize("name", ["pruned.jsonl", "pruned.jsonl.gz"])
def test_the_archive_holds_exactly_what_was_deleted(tmp_path, name):
    old = [ended_run(200, refs=("x", "y")) for _ in range(3)]
    kept = ended_run(5)
    path = tmp_path / name
    out = _command("prune", "--archive", str(path))
    assert out.startswith("deleted 3 run(s)")
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt") as f:
        records = [json.loads(line) for line in f]
    assert sorted(r["run"]["id"] for r in records) == sorted(r.pk for r in old)
    assert kept.pk not in {r["run"]["id"] for r in records}
    for record in records:
        assert len(record["resources"]) == 3 and len(record["attempts"]) == 3 and len(record["steps"]) == 1
        assert {row["ref"] for row in record["resources"]} >= {"x", "y"}
        assert record["log"][0]["kind"] == "run.completed"


def test_a_batch_whose_delete_fails_is_cut_off_the_archive(tmp_path, monkeypatch):
    ended_run(200)
    path = tmp_path / "pruned.jsonl.gz"
    archive = Archive(path)
    from cleanup import retention

    def broken(model, ids, column="run_id"):
        raise RuntimeError("the database went away")

    monkeypatch.setattr(retention, "_delete_of_runs", broken)
    with pytest.raises(RuntimeError):
        prune(days=90, archive=archive)
    archive.close()
    assert path.read_bytes() == b""
    assert Run.objects.count() == 1


def test_the_prune_schedule_is_ensured_once_beside_the_tick():
    ensure_schedule()
    ensure_schedule()
    schedules = Schedule.objects.filter(name=PRUNE_SCHEDULE_NAME)
    assert schedules.count() == 1
    assert schedules.get().func == "cleanup.tasks.prune_task"
    assert schedules.get().schedule_type == Schedule.HOURLY


def test_the_scheduled_task_prunes_with_the_settings(settings):
    settings.EVENT_RETENTION_DAYS = 30
    old, young = ended_run(31), ended_run(29)
    assert prune_task().startswith("deleted 1 run(s)")
    assert list(Run.objects.values_list("pk", flat=True)) == [young.pk]
    assert not Run.objects.filter(pk=old.pk).exists()


def test_bad_command_input_is_one_clear_error(tmp_path):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="days is a whole number"):
        call_command("prune", "--older-than", "ten")
    with pytest.raises(CommandError, match="--archive: cannot write"):
        call_command("prune", "--archive", str(tmp_path / "no" / "such" / "dir.jsonl"))
    with pytest.raises(CommandError, match="a --dry-run deletes nothing"):
        call_command("prune", "--dry-run", "--archive", str(tmp_path / "a.jsonl"))


def _command(*args):
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()


@pytest.mark.django_db(transaction=True)
def test_pruning_passes_over_a_run_another_worker_holds_and_never_waits_for_it():
    import threading

    from django.db import connections, transaction

    held, free = ended_run(200), ended_run(200)
    locked, done = threading.Event(), threading.Event()

    def other_worker():
        with transaction.atomic():
            Run.objects.select_for_update().get(pk=held.pk)
            locked.set()
            done.wait(30)
        connections.close_all()

    holder = threading.Thread(target=other_worker)
    holder.start()
    try:
        assert locked.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")  # a wait would fail the test, not hang it
        result = prune(days=90)
    finally:
        done.set()
        holder.join()
    assert result.run_ids == [free.pk]
    assert list(Run.objects.values_list("pk", flat=True)) == [held.pk]
    assert prune(days=90).run_ids == [held.pk]
