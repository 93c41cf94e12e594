"""The runs' tally (`cleanup.tally`): the metrics' runs by status without counting every run.

It is kept by triggers whatever writes the runs table (the ORM, a bulk
insert, an UPDATE of many runs, retention's raw DELETE, a TRUNCATE), folded without
changing a sum, and appended to without one writer waiting for another.
"""

import importlib
import random
import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import close_old_connections, connection, transaction
from django.db.models import Count
from django.utils import timezone

from cleanup import retention, tally
from cleanup.models import CleanupStatus, Run, RunStatus, RunTally
from tests.fakes import make_run

MIGRATION = importlib.import_module("cleanup.migrations.0021_runs_are_tallied_and_runs_left_to_a_person_indexed")


def kept():
    """What the tally table itself adds up to, read without `tally.counts`."""
    found = dict.fromkeys(tally.PAIRS, 0)
    for status, cleanup_status, delta in RunTally.objects.values_list("status", "cleanup_status", "delta"):
        found[(status, cleanup_status)] += delta
    return found


def counted():
    """Every pair counted from the runs themselves, zero where there is none."""
    found = dict.fromkeys(tally.PAIRS, 0)
    for row in Run.objects.values("status", "cleanup_status").annotate(n=Count("id")).order_by():
        found[(row["status"], row["cleanup_status"])] = row["n"]
    return found


@pytest.mark.django_db
def test_every_way_of_writing_runs_is_tallied():
    a = make_run(status=RunStatus.RUNNING, cleanup_status=CleanupStatus.NOT_REQUIRED)
    Run.objects.bulk_create([Run(name=f"bulk {i}", status=RunStatus.COMPLETED) for i in range(5)])
    assert kept() == counted()

    a.status = RunStatus.CANCELLED
    a.cleanup_status = CleanupStatus.PENDING
    a.save()  # every column written: tallied once, as a move
    Run.objects.filter(name__startswith="bulk").update(cleanup_status=CleanupStatus.INCOMPLETE)
    Run.objects.filter(pk=a.pk).update(name="renamed")  # no status moved: nothing appended
    assert kept() == counted()
    assert kept()[(RunStatus.COMPLETED, CleanupStatus.INCOMPLETE)] == 5

    with connection.cursor() as cursor:
        cursor.execute("UPDATE cleanup_run SET status = 'aborted' WHERE name = 'bulk 0'")
        cursor.execute("DELETE FROM cleanup_run WHERE name IN ('bulk 1', 'bulk 2')")
    Run.objects.filter(name="bulk 3").delete()
    assert kept() == counted()
    assert sum(kept().values()) == Run.objects.count() == 3


@pytest.mark.django_db
def test_the_metrics_read_the_tally_not_the_runs(django_assert_num_queries):
    make_run()
    RunTally.objects.create(status=RunStatus.ABORTED, cleanup_status=CleanupStatus.INCOMPLETE, delta=7)
    with django_assert_num_queries(1):
        counts = tally.counts()
    assert counts[(RunStatus.ABORTED, CleanupStatus.INCOMPLETE)] == 7  # not in the runs table
    assert counts[(RunStatus.COMPLETED, CleanupStatus.NOT_REQUIRED)] == 1
    assert set(counts) == set(tally.PAIRS)


@pytest.mark.django_db
def test_a_name_change_appends_nothing():
    run = make_run()
    before = RunTally.objects.count()
    Run.objects.filter(pk=run.pk).update(name="other", updated_at=timezone.now())
    run.refresh_from_db()
    run.save(update_fields=["name"])
    assert RunTally.objects.count() == before


@pytest.mark.django_db
def test_retention_deleting_old_runs_is_tallied():
    old = timezone.now() - timedelta(days=200)
    for i in range(4):
        make_run(name=f"old {i}", cleanup_status=CleanupStatus.COMPLETE, ended_at=old)
    make_run(name="recent", cleanup_status=CleanupStatus.COMPLETE, ended_at=timezone.now())
    assert retention.prune(days=90).runs == 4
    assert kept() == counted()
    assert kept()[(RunStatus.COMPLETED, CleanupStatus.COMPLETE)] == 1


@pytest.mark.django_db
def test_a_truncate_empties_the_tally_with_the_runs():
    make_run()
    make_run(status=RunStatus.RUNNING)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE cleanup_run CASCADE")
    assert not RunTally.objects.exists()
    make_run()
    assert kept() == counted()


@pytest.mark.django_db
def test_folding_keeps_every_sum_and_leaves_a_row_per_pair_zeros_included():
    runs = [make_run(status=RunStatus.RUNNING) for _ in range(3)]
    for run in runs:
        Run.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED, cleanup_status=CleanupStatus.PENDING)
    Run.objects.filter(pk__in=[r.pk for r in runs]).update(cleanup_status=CleanupStatus.COMPLETE)
    before = kept()
    assert RunTally.objects.count() > 3

    tally.fold()

    assert kept() == before == counted()
    pairs = list(RunTally.objects.values_list("status", "cleanup_status", "delta"))
    assert len(pairs) == len({(s, c) for s, c, _ in pairs})  # one row per pair
    # A pair seen before keeps its row at zero: its series stays, at 0, rather than vanishing.
    assert (RunStatus.RUNNING, CleanupStatus.NOT_REQUIRED, 0) in pairs
    tally.fold()
    assert kept() == counted()


@pytest.mark.django_db
def test_a_long_mixed_history_keeps_the_tally_equal_to_the_runs():
    rng = random.Random(20261202)
    statuses, cleanups = RunStatus.values, CleanupStatus.values
    for step in range(300):
        ids = list(Run.objects.values_list("pk", flat=True))
        choice = rng.random()
        if choice < 0.3 or not ids:
            Run.objects.bulk_create(
                [Run(name="r", status=rng.choice(statuses), cleanup_status=rng.choice(cleanups))] * rng.randint(1, 3)
            )
        elif choice < 0.7:
            chosen = rng.sample(ids, k=min(len(ids), rng.randint(1, 4)))
            moved = {"status": rng.choice(statuses)} if rng.random() < 0.5 else {"cleanup_status": rng.choice(cleanups)}
            Run.objects.filter(pk__in=chosen).update(**moved)
        elif choice < 0.9:
            Run.objects.filter(pk=rng.choice(ids)).delete()
        else:
            tally.fold()
        if step % 25 == 0:
            assert kept() == counted(), f"after step {step}"
    assert kept() == counted()


@pytest.mark.django_db
def test_the_migration_seeds_the_tally_from_the_runs_already_there():
    def editor():
        return SimpleNamespace(connection=connection, execute=lambda sql: connection.cursor().execute(sql))

    MIGRATION.on_postgresql(MIGRATION.DROP)(None, editor())
    RunTally.objects.all().delete()
    for status in (RunStatus.RUNNING, RunStatus.COMPLETED, RunStatus.COMPLETED):
        make_run(status=status)
    assert not RunTally.objects.exists()  # no trigger: nothing kept

    MIGRATION.on_postgresql(MIGRATION.TRIGGERS)(None, editor())

    assert kept() == counted()
    make_run(status=RunStatus.ABORTED)
    assert kept() == counted()


@pytest.mark.django_db(transaction=True)
def test_two_transactions_moving_runs_at_once_do_not_wait_for_each_other_and_a_fold_between_loses_nothing():
    a, b = make_run(status=RunStatus.RUNNING), make_run(status=RunStatus.RUNNING)
    holding, release, done = threading.Event(), threading.Event(), []

    def first():
        try:
            with transaction.atomic():
                Run.objects.filter(pk=a.pk).update(status=RunStatus.COMPLETED)
                holding.set()
                release.wait(10)
            done.append("first")
        finally:
            close_old_connections()
            connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    assert holding.wait(10)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '2s'")  # waiting on the first would fail here
        Run.objects.filter(pk=b.pk).update(status=RunStatus.CANCELLED)
    tally.fold()  # the first's change is not committed: it is left as it is
    release.set()
    thread.join(10)
    assert done == ["first"]
    assert kept() == counted()
    assert kept()[(RunStatus.RUNNING, CleanupStatus.NOT_REQUIRED)] == 0
