"""`manage.py bench --night`: a real shard and cluster give back every row, and the JSON has the figures.

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

from tests.test_bench import server_url

pytestmark = [
    pytest.mark.slow,
]


@pytest.fixture
def scratch(monkeypatch):
    name = f"eventsite_bench_night_test_{os.getpid()}"
    monkeypatch.setenv("BENCH_DATABASE_URL", server_url(name))
    yield name
    with psycopg.connect(server_url("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def night(*args):
    out = StringIO()
    call_command("bench", "--night", "--json", *args, stdout=out, stderr=StringIO())
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def rows_of(name):
    with psycopg.connect(server_url(name)) as conn:
        return dict(
            conn.execute(
                "SELECT r.name, count(*) FILTER (WHERE x.state = 'reverted' AND x.kind <> 'step') "
                "FROM cleanup_run r JOIN cleanup_resource x ON x.run_id = r.id GROUP BY r.name"
            ).fetchall()
        )


def test_it_gives_back_every_row_through_the_cluster_and_prints_the_figures(scratch):
    result = night(
        "--samples",
        "3",
        "--night-runs",
        "2",
        "--night-steps",
        "2",
        "--creatures",
        "2",
        "--long-steps",
        "3",
        "--repeats",
        "1",
        "--shard-latency-ms",
        "5",
    )

    assert rows_of(scratch) == {
        "time to clean 1 1": 1,
        "time to clean 2 1": 1,
        "time to clean 3 1": 1,
        "big night 1 1": 4,
        "big night 1 2": 4,
        "long run 1 1": 6,
    }
    assert result["broker"] == ("Redis" if settings.REDIS_URL else "ORM")
    ttc = result["time_to_clean_ms"]
    assert len(ttc["samples"]) == 3 and all(ms > 0 for ms in ttc["samples"])
    assert ttc["median"] > 0 and ttc["p90"] >= ttc["median"] and ttc["queue_hop_median"] > 0
    assert {k: result["night"][k] for k in ("runs", "groups", "rows")} == {"runs": 2, "groups": 4, "rows": 8}
    assert {k: result["long_run"][k] for k in ("runs", "groups", "rows")} == {"runs": 1, "groups": 3, "rows": 6}
    for measure in (result["night"], result["long_run"]):
        assert measure["seconds"] > 0 and len(measure["all"]) == 1 and sum(measure["passes"].values()) >= 1
    assert result["options"]["latency_ms"] == 5
    assert result["machine"]["postgresql"] and result["machine"]["load_average_at_start"]


def test_it_refuses_the_sweep_benchs_options_with_night_and_the_nights_without_it():
    with pytest.raises(CommandError, match="--resources applies without --night"):
        night("--resources", "2")
    with pytest.raises(CommandError, match="--samples applies only with --night"):
        call_command("bench", "--samples", "2", stdout=StringIO(), stderr=StringIO())
