"""Rule 9 on PostgreSQL: sweepers and tickers in separate processes, racing over the same runs."""

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import time_machine
from django.conf import settings
from django.utils import timezone

from cleanup import registry
from cleanup.models import CleanupStatus, Resource
from cleanup.sweep import sweep
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]


def database_url():
    db = settings.DATABASES["default"]
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def start_sweeper(calls_file, *extra, **settings_env):
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DEBUG": "1",
        "DJANGO_SETTINGS_MODULE": "eventsite.settings",
        "EVENT_REVERT_BACKOFF_S": "0",
        **settings_env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.worker_proc", str(calls_file), *extra],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_calls(calls_file):
    if not calls_file.exists():
        return []
    return [json.loads(line) for line in calls_file.read_text().splitlines() if line.strip()]


def test_two_sweeper_processes_revert_each_row_exactly_once(tmp_path):
    runs = []
    for r in range(6):
        run = make_run(name=f"raid {r}")
        for s in range(5):
            make_rows(make_step(run, action_id="conc.spawn"), [f"r{r}-s{s}-c{c}" for c in range(4)], module="conc")
        runs.append(run)
    calls_file = tmp_path / "calls.jsonl"

    # One run per batch, and calls slow enough that the second process starts while the
    # first still has runs to take: a batch claims all its runs' groups at once.
    sweepers = [start_sweeper(calls_file, "--delay", "1", EVENT_CLEANUP_RUN_BATCH="1") for _ in range(2)]
    for proc in sweepers:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err

    calls = read_calls(calls_file)
    refs = [ref for call in calls for ref in call["refs"]]
    assert len(refs) == 6 * 5 * 4
    assert len(set(refs)) == len(refs), "a row was reverted twice"
    keys = [call["key"] for call in calls]
    assert len(set(keys)) == len(keys) == 30, "a step group was sent twice"
    assert len({call["pid"] for call in calls}) == 2, "the two sweepers did not overlap at all"
    assert set(Resource.objects.values_list("state", "revert_attempts")) == {("reverted", 1)}
    assert all(r.cleanup_status == CleanupStatus.COMPLETE for r in type(runs[0]).objects.all())


def test_two_ticker_processes_never_perform_one_step_twice(tmp_path):
    from unittest import mock

    from cleanup.models import Run, Step
    from cleanup.runner import start_run

    registry.register_action(FakeAction(id="conc.spawn", module="conc"))
    with mock.patch("cleanup.runner.queue_tick"):  # the tickers below are the only ones
        for r in range(8):
            start_run(f"raid {r}", [{"action": "conc.spawn", "params": {}} for _ in range(4)])
    calls_file = tmp_path / "calls.jsonl"

    tickers = [start_sweeper(calls_file, "--tick", "--delay", "0.01", "--passes", "200") for _ in range(2)]
    for proc in tickers:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err

    calls = read_calls(calls_file)
    performed = [c["key"] for c in calls if c["verb"] == "perform"]
    assert sorted(performed) == sorted(Step.objects.values_list("idempotency_key", flat=True)), (
        "a step was performed twice, or not at all"
    )
    assert len({c["pid"] for c in calls if c["verb"] == "perform"}) == 2, "the tickers did not overlap"
    assert set(Step.objects.values_list("status", "attempts")) == {("done", 1)}
    assert set(Run.objects.values_list("status", "cleanup_status")) == {("completed", "complete")}
    reverted = [ref for c in calls if c["verb"] == "revert" for ref in c["refs"]]
    assert len(reverted) == len(set(reverted)) == 32


def test_a_claim_left_by_a_killed_sweeper_is_taken_again_after_the_timeout_keeping_its_attempt(tmp_path):
    run = make_run()
    step = make_step(run, action_id="conc.spawn")
    make_rows(step, ["orc-1", "orc-2"], module="conc", placeholder=False)
    calls_file = tmp_path / "calls.jsonl"

    proc = start_sweeper(calls_file, "--hang")
    deadline = time.monotonic() + 60
    while not read_calls(calls_file):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the sweeper never called revert"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)

    rows = list(Resource.objects.order_by("ref"))
    assert {(r.state, r.revert_attempts) for r in rows} == {("reverting", 1)}
    expires = rows[0].claim_expires_at

    revert = Scripted({"ok": True, "failed": []})
    registry.register_action(FakeAction(id="conc.spawn", module="conc", revert=revert))
    assert sweep().summary.attempted == 0, "a live claim was taken"
    assert revert.calls == []

    with time_machine.travel(expires + timedelta(seconds=1), tick=False):
        result = sweep()

    assert result.summary.reverted == 2
    assert revert.calls[0]["idempotency_key"] == step.idempotency_key
    assert set(Resource.objects.values_list("state", "revert_attempts")) == {("reverted", 2)}


def test_the_verdict_of_a_superseded_claim_changes_nothing():
    """A slow sweeper whose claim expired and was taken over cannot overwrite the new verdict."""
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    second_verdict = {}

    def slow_then_taken_over(**kwargs):
        # While the first sweeper waits on the module, its claim expires and a second
        # sweeper (another connection: this is the module's own thread) takes the row
        # and reverts it.
        later = timezone.now() + timedelta(seconds=600)
        with time_machine.travel(later, tick=False):
            registry.unregister_module("test")
            registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
            second_verdict["summary"] = sweep().summary
        return {"ok": False, "error": "first sweeper: shard said no"}

    registry.register_action(FakeAction(revert=slow_then_taken_over))
    first = sweep()

    assert second_verdict["summary"].reverted == 1
    assert first.summary.failed == 0
    row = Resource.objects.get()
    assert (row.state, row.last_error, row.revert_attempts) == ("reverted", "", 2)
    assert not run.log.filter(kind="cleanup.failed").exists()
