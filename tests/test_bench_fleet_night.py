"""`manage.py bench --night --fleet N --fleet-down K`: shards, K down, an idle restart, and the JSON has the figures.

Tiny sizes on a scratch database of the test server; no timing is asserted here, the
figures (and whether they meet the issue's targets) belong to the benchmark itself.
"""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from eventsite.bench import fleet_night
from eventsite.bench.management.commands.bench import FLEET_MAX
from eventsite.bench.report import fleet_table
from tests.test_bench_night import night, rows_of, scratch  # noqa: F401  (the fixture)


@pytest.mark.slow
def test_a_fleet_night_gives_back_every_row_of_every_shard_and_prints_the_figures(scratch):  # noqa: F811
    result = night(
        "--fleet",
        "4",
        "--fleet-down",
        "2",
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
    # Each step on a shard in turn: 3 of the 12 groups on each shard, the last two down.
    keys = ("shards", "down", "down_shards", "fleet_down", "runs", "groups", "rows", "healthy_rows", "down_rows")
    assert {k: f[k] for k in keys} == {
        "shards": 4,
        "down": "s3..s4",
        "down_shards": ["s3", "s4"],
        "fleet_down": 2,
        "runs": 2,
        "groups": 12,
        "rows": 24,
        "healthy_rows": 12,
        "down_rows": 12,
    }
    h, d, r = f["healthy"], f["down_shard"], f["idle_restart"]
    assert h["seconds_no_shard_down"] > 0 and h["seconds_down"] > 0 and h["ratio"] > 0
    assert len(h["all_no_shard_down"]) == len(h["all_down"]) == 1
    # The names of the one-shard-down days still answer, with the same figures.
    assert (h["seconds_one_down"], h["all_one_down"]) == (h["seconds_down"], h["all_down"])
    # The wake tasks that slept in a worker while the healthy rows were given back, night by night.
    assert len(h["wake_tasks_down"]) == len(h["wake_tasks_no_shard_down"]) == 1
    for tasks, seconds in (("wake_tasks_down", "seconds_down"), ("wake_tasks_no_shard_down", "seconds_no_shard_down")):
        for task in h[tasks][0]:
            assert task["queued_s"] <= h[seconds] + 0.01 and task["done_s"] >= -0.01
    assert h["seconds_down"] / h["seconds_no_shard_down"] == pytest.approx(h["ratio"], rel=0.02)  # of rounded figures
    assert d["attempts_spent"] >= 0 and d["seconds_from_return"] > 0 and d["back_after_end_s"] >= 1
    assert r == {**r, "shard": "s1", "rows": 12} and 0 < r["found_s"] <= r["given_back_s"]
    assert f["engine"] == {"EVENT_OUTAGE_PROBE_S": 2, "EVENT_OUTAGE_SPREAD_S": 5, "EVENT_BACKEND_WATCH_S": 10}
    assert result["options"]["fleet"] == 4 and result["options"]["fleet_down"] == 2
    assert result["options"]["tick_every_s"] == 2
    assert result["machine"]["load_average_at_start"] and result["machine"]["load_average"]
    start = f["start"]
    assert start["concurrently"] and start["seconds"] > 0
    assert 0 < start["rss_mb_median"] <= start["rss_mb_median_at_end"] * 2 and start["rss_mb_total_at_end"] > 0
    assert "2 down (s3..s4)" in fleet_table(result) and "shards started together in" in fleet_table(result)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--fleet", "3"], "--fleet applies only with --night"),
        (["--night", "--back-after-s", "3"], "--back-after-s applies only with --night --fleet N"),
        (["--night", "--tick-every-s", "0"], "--tick-every-s applies only with --night --fleet N"),
        (["--night", "--fleet", "3", "--long-steps", "3"], "--long-steps applies to the one-shard night"),
        (["--night", "--fleet", "3", "--samples", "3"], "--samples applies to the one-shard night"),
        (["--night", "--fleet-down", "2"], "--fleet-down applies only with --night --fleet N"),
        (["--night", "--fleet", "3", "--fleet-down", "0"], r"--fleet-down K .* 1 <= K < 3 .*got 0"),
        (["--night", "--fleet", "3", "--fleet-down", "3"], r"--fleet-down K .* 1 <= K < 3 .*got 3"),
        (["--night", "--fleet", "3", "--fleet-down", "two"], "--fleet-down: invalid int value"),
    ],
)
def test_it_refuses_the_fleet_nights_options_where_they_do_not_apply(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("bench", *args, stdout=StringIO(), stderr=StringIO())


@pytest.mark.parametrize("shards", ["1", str(FLEET_MAX + 1)])
def test_a_fleet_has_two_shards_at_least_and_a_bounded_number(shards):
    with pytest.raises(CommandError, match=rf"--fleet: N is the number of shards, 2 to {FLEET_MAX} .*got {shards}"):
        call_command("bench", "--night", "--fleet", shards, stdout=StringIO(), stderr=StringIO())


def test_a_fleet_of_100_shards_with_10_down_reaches_the_fleet_night(monkeypatch):
    seen = []
    monkeypatch.setattr(fleet_night, "run", lambda options, progress: seen.append(options) or {"mode": "fleet-night"})

    call_command("bench", "--night", "--json", "--fleet", "100", "--fleet-down", "10", stdout=StringIO())
    call_command("bench", "--night", "--json", "--fleet", "100", stdout=StringIO())

    assert [(o.fleet, o.fleet_down) for o in seen] == [(100, 10), (100, 1)]
