"""The finder, sent by every pass, is a prepared statement with one generic plan on
PostgreSQL: planned once per connection, not at every pass."""

import pytest
from django.db import connection
from django.utils import timezone

from cleanup import statements
from cleanup.work import runs_needing_cleanup
from tests.fakes import make_rows, make_run, make_step

pytestmark = pytest.mark.django_db


def prepared():
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        return cursor.fetchall()


@pytest.fixture(autouse=True)
def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: prepared statements are a PostgreSQL matter")


def test_the_finder_is_prepared_once_and_runs_on_a_generic_plan():
    run = make_run()
    make_rows(make_step(run), ["orc-1"])
    runs_needing_cleanup(timezone.now(), 20)  # prepared now, if an earlier test has not
    before = [row for row in prepared() if "WITH RECURSIVE owing" in row[0]]

    answers = [runs_needing_cleanup(timezone.now(), 20) for _ in range(3)]

    assert answers == [[run.pk]] * 3
    after = [row for row in prepared() if "WITH RECURSIVE owing" in row[0]]
    assert len(before) == len(after) == 1, "prepared more than once, or not at all"
    assert (after[0][1] - before[0][1], after[0][2] - before[0][2]) == (3, 0), "planned anew for each call"


def test_a_site_behind_a_transaction_pooler_prepares_nothing(monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)
    run = make_run()
    make_rows(make_step(run), ["orc-1"])

    assert runs_needing_cleanup(timezone.now(), 20) == [run.pk]
    assert not [row for row in prepared() if "WITH RECURSIVE owing" in row[0]]


def test_prepared_statements_go_through_djangos_query_log(django_assert_num_queries):
    with django_assert_num_queries(1):
        assert statements.fetch_prepared("SELECT %s::int + 1", [41]) == [(42,)]
