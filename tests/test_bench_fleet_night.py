"""`manage.py bench --night --fleet N`: shards, one down, an idle restart, and the JSON has the figures.

Tiny sizes on a scratch database of the test server; no timing is asserted here, the
figures (and whether they meet the issue's targets) belong to the benchmark itself.
"""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tests.test_bench_night import night, rows_of, scratch  # noqa: F401  (the fixture)


@pytest.mark.slow
def test_a_fleet_night_gives_back_every_row_of_every_shard_and_prints_the_figures(scratch):  # noqa: F811
    result = night(
        "--fleet",
        "3",
        "--night-runs",
        "2",
        "--night-steps",
        "6",
        "--creatures",
        "2",
        "--repeats",
        "1",
        "--shard-latency-ms",
        "5",
        "--back-after-s",
        "1",
    )

    # Each night: 2 runs of 6 spawns of 2 creatures; the idle restart: one run of 6.
    assert rows_of(scratch) == {
        "fleet night 1 1": 12,
        "fleet night 1 2": 12,
        "fleet night down 1 1": 12,
        "fleet night down 1 2": 12,
        "idle restart 1 1": 12 + 12,  # its creatures, and each again once found after the restart
    }
    assert result["mode"] == "fleet-night"
    f = result["fleet"]
    # Each step on a shard in turn: 4 of the 12 groups on each shard, the last one down.
    assert {k: f[k] for k in ("shards", "down", "runs", "groups", "rows", "healthy_rows", "down_rows")} == {
        "shards": 3,
        "down": "s3",
        "runs": 2,
        "groups": 12,
        "rows": 24,
        "healthy_rows": 16,
        "down_rows": 8,
    }
    h, d, r = f["healthy"], f["down_shard"], f["idle_restart"]
    assert h["seconds_no_shard_down"] > 0 and h["seconds_one_down"] > 0 and h["ratio"] > 0
    assert len(h["all_no_shard_down"]) == len(h["all_one_down"]) == 1
    assert d["attempts_spent"] >= 0 and d["seconds_from_return"] > 0 and d["back_after_end_s"] >= 1
    assert r == {**r, "shard": "s1", "rows": 12} and 0 < r["found_s"] <= r["given_back_s"]
    assert f["engine"] == {"EVENT_OUTAGE_PROBE_S": 2, "EVENT_OUTAGE_SPREAD_S": 5, "EVENT_BACKEND_WATCH_S": 10}
    assert result["options"]["fleet"] == 3 and result["options"]["tick_every_s"] == 2
    assert result["machine"]["load_average_at_start"] and result["machine"]["load_average"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--fleet", "3"], "--fleet applies only with --night"),
        (["--night", "--back-after-s", "3"], "--back-after-s applies only with --night --fleet N"),
        (["--night", "--tick-every-s", "0"], "--tick-every-s applies only with --night --fleet N"),
        (["--night", "--fleet", "3", "--long-steps", "3"], "--long-steps applies to the one-shard night"),
        (["--night", "--fleet", "3", "--samples", "3"], "--samples applies to the one-shard night"),
    ],
)
def test_it_refuses_the_fleet_nights_options_where_they_do_not_apply(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("bench", *args, stdout=StringIO(), stderr=StringIO())


def test_a_fleet_has_two_shards_at_least():
    with pytest.raises(CommandError, match="--fleet"):
        call_command("bench", "--night", "--fleet", "1", stdout=StringIO(), stderr=StringIO())
