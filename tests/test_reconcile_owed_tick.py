"""Rule 14 with real processes: a restart that a lone `manage.py tick` saw (no cluster, so
the task it queued goes nowhere) is reconciled at a later tick, even when the ticker that
saw it was killed in the middle of its reconcile, and what came back is given back."""

import os
import signal
import subprocess
import sys
import time
from unittest import mock

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from django_q.models import OrmQ

from cleanup import registry
from cleanup.models import ModuleHealth, Resource
from cleanup.runner import cancel_run, start_run, tick
from eventsite.sandbox import module as sandbox
from tests import shard as shard_helpers
from tests.reliability.harness import database_url

shard_process = shard_helpers.shard_process

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

CLAIM_TIMEOUT_S = 2


def spawn(count):
    return {"action": "sandbox.spawn", "params": {"creature": "orc", "count": count, "at": "gate"}}


def creatures(shard):
    return [c for c in shard.get("/creatures").json()["creatures"] if c["key"]]


def tick_process(shard, log):
    """`manage.py tick` as an operator runs it from cron: the site's settings, no cluster."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        DATABASE_URL=database_url(),
        DEBUG="1",
        SANDBOX_SHARD_URL=shard.url,
        SANDBOX_SHARDS="",
        EVENT_CLAIM_TIMEOUT_S=str(CLAIM_TIMEOUT_S),
        EVENT_DEFAULT_BUDGET_MS="1000",
        EVENT_REVERT_BACKOFF_S="0",
        Q_SYNC="0",
    )
    env.pop("REDIS_URL", None)  # the queue is the database's: nobody takes from it here
    out = open(log, "w")
    return subprocess.Popen(
        [sys.executable, "manage.py", "tick"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def wait_for(predicate, what, process, log, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert process.poll() is None, f"the tick ended before {what}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}:\n{log.read_text()}"
        time.sleep(0.02)


def ticked(shard, log):
    process = tick_process(shard, log)
    assert process.wait(60) == 0, log.read_text()
    return log.read_text()


def test_a_restart_seen_by_a_lone_tick_is_reconciled_at_a_later_tick_though_its_task_is_lost(shard_process, tmp_path):
    shard = shard_process
    sandbox.fleet.forget()
    with override_settings(SANDBOX_SHARD_URL=shard.url, SANDBOX_SHARDS={}, EVENT_REVERT_BACKOFF_S=0):
        run = start_run("raid", [spawn(3), {"action": "core.wait", "params": {"seconds": 3600}}])
        tick()  # spawns them, and the watch notes the shard's first boot id
        shard.post("/save")  # the save holds the three orcs
        cancel_run(run.pk)  # its cleanup runs at once here (django-q2's sync mode)
    sandbox.fleet.forget()
    assert creatures(shard) == []
    health = ModuleHealth.objects.get(module="sandbox", backend="")
    assert health.boot_id == shard.boot_id

    shard.post("/restart", json={"mode": "rollback"})  # a crash: back to the save
    assert len(creatures(shard)) == 3
    ModuleHealth.objects.filter(pk=health.pk).update(watched_at=None)  # the watch is due
    OrmQ.objects.all().delete()

    # A lone ticker sees the restart and is killed in the middle of the reconcile it owes.
    shard.post("/faults", json={"latency_ms": 1500})
    first = tick_process(shard, tmp_path / "first.log")
    owed = ModuleHealth.objects.filter(pk=health.pk, reconcile_owed_since__isnull=False)
    claimed = owed.filter(reconcile_claim_token__isnull=False)
    wait_for(claimed.exists, "the ticker claimed the debt", first, tmp_path / "first.log")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    health.refresh_from_db()
    assert health.boot_id != shard.boot_id and health.restarts_seen == 1
    assert health.reconcile_owed_since is not None, "the restart was forgotten with its ticker"
    assert not Resource.objects.filter(run=run, resurrected_from__isnull=False).exists()
    # The task it queued to hurry the reconcile sits in a queue no cluster reads; it is lost.
    assert [q.name() for q in OrmQ.objects.all()] == ["owed reconcile"]
    OrmQ.objects.all().delete()

    # A later tick, once the dead ticker's claim has expired, pays the debt.
    shard.delete("/faults")
    time.sleep(CLAIM_TIMEOUT_S + 0.5)
    line = ticked(shard, tmp_path / "second.log")
    assert "owed reconciles: 1 done" in line, line
    health.refresh_from_db()
    assert (health.reconcile_owed_since, health.reconcile_claim_token) == (None, None)
    again = Resource.objects.filter(run=run, resurrected_from__isnull=False)
    assert again.count() == 3

    # The pass that reconcile queued is lost as well; the next tick's own pass gives them back.
    OrmQ.objects.all().delete()
    ticked(shard, tmp_path / "third.log")
    assert creatures(shard) == []
    assert set(again.values_list("state", flat=True)) == {"reverted"}


def test_two_lone_tickers_at_once_make_one_owed_reconcile(shard_process, tmp_path):
    shard = shard_process
    sandbox.fleet.forget()
    with override_settings(SANDBOX_SHARD_URL=shard.url, SANDBOX_SHARDS={}, EVENT_REVERT_BACKOFF_S=0):
        run = start_run("raid", [spawn(2), {"action": "core.wait", "params": {"seconds": 3600}}])
        tick()
        shard.post("/save")
        cancel_run(run.pk)
    sandbox.fleet.forget()
    shard.post("/restart", json={"mode": "rollback"})
    with mock.patch("cleanup.outages.queue_owed_reconcile"):  # the task that hurries it is lost
        registry.backend_restarted("sandbox")
    ModuleHealth.objects.filter(module="sandbox").update(watched_at=timezone.now())  # no watch: the debt alone
    OrmQ.objects.all().delete()

    shard.post("/faults", json={"latency_ms": 2500})  # each reconcile holds its claim a while
    tickers = [tick_process(shard, tmp_path / f"ticker-{n}.log") for n in range(2)]
    for ticker in tickers:
        assert ticker.wait(60) == 0
    lines = [(tmp_path / f"ticker-{n}.log").read_text() for n in range(2)]
    assert sum("owed reconciles: 1 done" in line for line in lines) == 1, lines
    assert ModuleHealth.objects.get(module="sandbox", backend="").reconcile_owed_since is None
    assert Resource.objects.filter(run=run, resurrected_from__isnull=False).count() == 2
