"""`manage.py bench`: one JSON line, and every way really gives back every row.

Tiny sizes on a scratch database of the test server; no timing is asserted here, the
figures belong to the benchmark itself.
"""

import json
import os
from io import StringIO

import psycopg
import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from eventsite.bench import plain_sql

pytestmark = [
    pytest.mark.slow,
]


def server_url(name):
    db = settings.DATABASES["default"]
    auth = (db.get("USER") or "postgres") + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{name}"


@pytest.fixture(scope="module")
def scratch_name():
    name = f"eventsite_bench_test_{os.getpid()}"
    yield name
    with psycopg.connect(server_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def scratch(scratch_name, monkeypatch):
    monkeypatch.setenv("BENCH_DATABASE_URL", server_url(scratch_name))
    return scratch_name


def bench(*args):
    out = StringIO()
    call_command(
        "bench",
        "--json",
        "--runs",
        "3",
        "--steps",
        "2",
        "--resources",
        "2",
        "--repeats",
        "1",
        *args,
        stdout=out,
        stderr=StringIO(),
    )
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def test_it_prints_one_json_line_in_which_every_way_gave_back_every_row(scratch):
    result = bench("--history", "45", "--workers", "2")

    assert (result["rows"], result["groups"]) == (12, 6)
    for way in ("sweep", "plain_sql", "row_at_a_time"):
        assert result[way]["reverted"] == 12
        assert result[way]["rows_per_s"] > 0
    assert result["sweep"]["queries_per_group"] > 0
    assert result["sweep"]["peak_rss_mb"] > 0
    assert result["ratio_to_plain_sql"] > 0 and result["ratio_to_row_at_a_time"] > 0
    assert result["finder_ms"]["no_history"] >= 0 and result["finder_ms"]["with_history"] >= 0
    assert result["finder"]
    assert set(result["workers"]) == {"1", "2"}
    assert result["machine"]["postgresql"]


def test_it_leaves_out_workers_and_history_figures_it_did_not_measure(scratch):
    result = bench()

    assert "workers" not in result
    assert result["finder_ms"]["with_history"] is None


def test_it_refuses_a_way_that_leaves_rows_unresolved(scratch, monkeypatch):
    monkeypatch.setattr(plain_sql, "VERDICT", "SELECT %(ids)s, %(states)s, %(errors)s, %(token)s, %(backoff)s")

    with pytest.raises(CommandError, match=r"plain SQL 1/1 gave back 0 of 12 rows"):
        bench()


def test_it_refuses_to_empty_the_configured_database(monkeypatch):
    monkeypatch.setenv("BENCH_DATABASE_URL", server_url(settings.DATABASES["default"]["NAME"]))

    with pytest.raises(CommandError, match="will not use"):
        bench()


@pytest.mark.django_db
def test_a_finder_that_claims_is_timed_without_leaving_a_trace(monkeypatch):
    from cleanup.models import Resource
    from eventsite.bench import worker
    from tests.fakes import make_rows, make_run, make_step

    rows = make_rows(make_step(make_run()), ["orc-1"], placeholder=False)

    def claiming_finder(now, limit):
        Resource.objects.filter(pk=rows[0].pk).update(state="reverting")
        return [rows[0].run_id]

    monkeypatch.setattr(worker, "find_finder", lambda: ("tests.claiming_finder", claiming_finder))
    timed = worker.time_finder(3)

    assert timed["claims"] is True and timed["ms"] >= 0
    assert Resource.objects.get(pk=rows[0].pk).state == "live"


@pytest.mark.django_db
def test_a_finder_that_only_reads_is_timed_as_the_sweep_calls_it(monkeypatch):
    from eventsite.bench import worker

    calls = []
    monkeypatch.setattr(worker, "find_finder", lambda: ("tests.reader", lambda now, limit: calls.append(now) or []))

    timed = worker.time_finder(3)

    assert timed["claims"] is False and len(calls) == 4  # one to find out, three timed
