"""`manage.py bench --scrape` and `--beside-prune`: the costs of years in production.

Tiny sizes on a scratch database of the test server; no timing is asserted here, the
figures belong to the benchmark itself (docs/benchmarks.md).
"""

import json
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from tests.test_bench import scratch, scratch_name  # noqa: F401 (fixtures)

pytestmark = [
    pytest.mark.slow,
]

NS = settings.EVENT_METRICS_NAMESPACE
# Every metric the issue names, as prometheus_client names its families (a counter's without _total).
METRICS = [
    "ledger_rows",
    "runs",
    "rows_waiting_for_person",
    "oldest_unresolved_seconds",
    "backend_up",
    "module_calls",
    "module_call_seconds",
    "sweep_passes",
    "sweep_rows",
    "alerts_pending",
    "reconciles_owed",
    "oldest_owed_reconcile_seconds",
]


def bench(*args):
    out = StringIO()
    call_command("bench", "--json", *args, stdout=out, stderr=StringIO())
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def test_the_scrape_bench_times_every_metric_after_a_bad_night_beside_history(scratch):  # noqa: F811
    result = bench("--scrape", "--history", "60", "--runs", "2", "--steps", "2", "--resources", "3", "--repeats", "2")

    assert result["mode"] == "scrape" and result["history"] == 60
    assert sorted(result["metrics"]) == sorted(f"{NS}_{name}" for name in METRICS)
    for name, figures in result["metrics"].items():
        assert figures["no_history_ms"] >= 0 and figures["with_history_ms"] >= 0, name
        assert figures["statements"] <= 3, name
    # The night it scraped: one work set given back, another live with each run's first step failed.
    assert result["night"] == {"given_back": 12, "live": 6, "failed": 6}
    assert result["metrics"][f"{NS}_ledger_rows"]["samples"] == 2  # live and failed rows of the bench module
    assert result["metrics"][f"{NS}_backend_up"]["samples"] >= 1
    assert result["scrape_ms"]["no_history"] > 0 and result["scrape_ms"]["with_history"] > 0
    assert result["bytes"] > 0


def test_the_scrape_bench_without_history_leaves_its_figures_out(scratch):  # noqa: F811
    result = bench("--scrape", "--history", "0", "--runs", "1", "--steps", "1", "--resources", "2", "--repeats", "1")

    assert result["scrape_ms"]["with_history"] is None
    assert all(m["with_history_ms"] is None for m in result["metrics"].values())


def test_the_sweep_is_measured_alone_and_beside_a_whole_pruning_run(scratch):  # noqa: F811
    result = bench("--beside-prune", "--prune-runs", "30", "--runs", "3", "--steps", "2", "--resources", "2")

    assert result["mode"] == "beside-prune"
    assert (result["rows"], result["groups"]) == (12, 6)
    # Five repeats of each; every one gave back all 12 rows (the bench stops otherwise).
    assert len(result["sweep"]["alone"]) == len(result["sweep"]["beside_prune"]) == 5
    assert result["ratio"] > 0
    # The prune deleted exactly the 30 old runs each time (the bench stops otherwise), none of the work set.
    assert result["prune"]["runs"] == 30 and result["prune"]["rows"] == 600
    assert 0 <= result["prune"]["overlap"] <= 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--scrape", "--workers", "2"], "--workers does not apply to --scrape"),
        (["--scrape", "--prune-runs", "3"], "--prune-runs does not apply to --scrape"),
        (["--beside-prune", "--history", "5"], "--history does not apply to --beside-prune"),
        (["--beside-prune", "--latency-ms", "5"], "--latency-ms does not apply to --beside-prune"),
        (["--scrape", "--samples", "3"], "--samples does not apply to --scrape"),
        (["--scrape", "--night"], "--scrape applies without --night"),
        (["--scrape", "--beside-prune"], "two benches"),
        (["--prune-runs", "3"], "--prune-runs applies only with --beside-prune"),
    ],
)
def test_the_cost_benches_refuse_options_that_do_not_apply(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("bench", *args, stdout=StringIO(), stderr=StringIO())


def test_without_json_each_cost_bench_prints_a_table_for_a_person(scratch):  # noqa: F811
    out = StringIO()
    call_command(
        "bench",
        "--scrape",
        "--history",
        "0",
        "--runs",
        "1",
        "--steps",
        "1",
        "--resources",
        "2",
        "--repeats",
        "1",
        stdout=out,
        stderr=StringIO(),
    )
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("machine: ") and " load " in lines[0]
    assert any(line.startswith(f"{NS}_runs ") for line in lines)
    assert "the whole answer" in lines[-1]

    out = StringIO()
    call_command(
        "bench",
        "--beside-prune",
        "--prune-runs",
        "2",
        "--runs",
        "1",
        "--steps",
        "1",
        "--resources",
        "1",
        "--repeats",
        "1",
        stdout=out,
        stderr=StringIO(),
    )
    text = out.getvalue()
    assert text.startswith("machine: ") and "the sweep alone:" in text and "beside the prune:" in text
