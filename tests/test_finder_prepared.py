"""The finder, sent by every pass, is a prepared statement with one generic plan on
PostgreSQL: planned once per connection, not at every pass."""

import pytest
from django.db import connection

from cleanup import sql
from cleanup.sweep import runs_needing_cleanup, statements
from tests.fakes import make_rows, make_run, make_step


def prepared():
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        return cursor.fetchall()


@pytest.mark.django_db
def test_the_finder_is_prepared_once_and_runs_on_a_generic_plan():
    run = make_run()
    make_rows(make_step(run), ["orc-1"])
    runs_needing_cleanup(20)  # prepared now, if an earlier test has not
    before = [row for row in prepared() if "WITH RECURSIVE owing" in row[0]]

    answers = [runs_needing_cleanup(20) for _ in range(3)]

    assert answers == [[run.pk]] * 3
    after = [row for row in prepared() if "WITH RECURSIVE owing" in row[0]]
    assert len(before) == len(after) == 1, "prepared more than once, or not at all"
    assert (after[0][1] - before[0][1], after[0][2] - before[0][2]) == (3, 0), "planned anew for each call"


@pytest.mark.django_db
def test_a_site_behind_a_transaction_pooler_prepares_nothing(monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    run = make_run()
    make_rows(make_step(run), ["orc-1"])

    assert runs_needing_cleanup(20) == [run.pk]
    assert not [row for row in prepared() if "WITH RECURSIVE owing" in row[0]]


@pytest.mark.django_db
def test_prepared_statements_go_through_djangos_query_log(django_assert_num_queries):
    with django_assert_num_queries(1):
        assert statements.fetch_prepared("SELECT CAST(%s AS integer) + 1", [41]) == [(42,)]


def settings_of(env, tmp_path):
    import json
    import os
    import subprocess
    import sys

    from django.conf import settings

    code = (
        "import json, django; django.setup(); from django.conf import settings as s;"
        "print(json.dumps(bool(s.DATABASES['default'].get('DISABLE_SERVER_SIDE_CURSORS'))))"
    )
    full = {k: v for k, v in os.environ.items() if k != "DATABASE_TRANSACTION_POOLER"}
    full.update(
        DEBUG="1",
        DJANGO_SETTINGS_MODULE="eventsite.settings",
        EVENTSITE_VAR_DIR=str(tmp_path),
        DATABASE_URL="postgres://events@127.0.0.1:5432/events",
        **env,
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=settings.BASE_DIR, env=full, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_database_transaction_pooler_turns_server_side_statements_off(tmp_path):
    assert settings_of({"DATABASE_TRANSACTION_POOLER": "1"}, tmp_path) is True
    assert settings_of({}, tmp_path) is False


@pytest.mark.django_db
def test_the_finders_generic_plan_walks_the_index_of_owing_rows():
    """A generic plan cannot match a partial index against a parameter: the rules' constants
    are literals, so the skip scan reads ``finder_owing_run_idx``, not every row's run id."""
    import re

    from psycopg import sql as psql

    from cleanup.models import Resource, ResourceState

    # A ledger mostly given back, as the planner would see it on a site with history.
    for r in range(40):
        run = make_run(name=f"done {r}")
        make_rows(make_step(run), [f"orc-{r}-{i}" for i in range(50)], placeholder=False)
    Resource.objects.update(state=ResourceState.REVERTED)
    make_rows(make_step(make_run(name="owing")), ["troll-1"])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE cleanup_resource")

    sql, params = statements.finder(connection.alias, 3)
    values = [*params, 20]
    numbered = iter(range(1, len(values) + 1))
    text = re.sub("%s", lambda _: f"${next(numbered)}", sql)
    raw = connection.connection
    with raw.cursor() as cursor:
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE finder_plan AS {text}")
        try:
            literals = psql.SQL(", ").join(psql.Literal(v) for v in values).as_string(raw)
            cursor.execute(f"EXPLAIN EXECUTE finder_plan({literals})")
            plan = "\n".join(line for (line,) in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE finder_plan")

    # The skip scan's first step (the lowest run that owes something) reads the index of
    # owing rows; a clause of parameters reads the run id index and filters every row.
    first_scan = re.search(r"Scan using (\w+) on cleanup_resource", plan).group(1)
    assert first_scan == "finder_owing_run_idx", plan


@pytest.mark.django_db
def test_a_site_whose_orm_binds_on_the_server_prepares_nothing_of_its_own(monkeypatch):
    # There the session's generic plans would reach every ORM query: the sweep stays out of it.
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {"server_side_binding": True})

    assert sql._prepares(connection) is False
