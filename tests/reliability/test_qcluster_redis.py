"""Two django-q2 clusters on one Redis, as two worker machines: every step once, every row once."""

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from unittest import mock

import pytest
import redis
from django.conf import settings

from cleanup import registry
from cleanup.models import Resource, Run, Step
from cleanup.runner import start_run
from tests.reliability.harness import PG_PROCESSES
from tests.reliability.recorder.module import Spawn

REDIS_URL = os.environ.get("RELIABILITY_REDIS_URL", "redis://127.0.0.1:6379/9")


def redis_answers():
    try:
        return redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError:
        return False


pytestmark = [*PG_PROCESSES, pytest.mark.skipif(not redis_answers(), reason=f"needs Redis at {REDIS_URL}")]

RUNS, STEPS, ROWS = 50, 4, 2


@pytest.fixture
def queue_name():
    name = f"reliability-{os.getpid()}"
    yield name
    connection = redis.from_url(REDIS_URL)
    for key in connection.scan_iter(f"django_q:{name}:*"):
        connection.delete(key)


def test_it_performs_each_step_once_and_gives_each_row_back_once_with_two_clusters(workers, queue_name):
    registry.register_action(Spawn())
    with mock.patch("cleanup.runner.queue_tick"):  # the clusters below do every tick
        for r in range(RUNS):
            start_run(f"raid {r}", [{"action": "rel.spawn", "params": {"count": ROWS}} for _ in range(STEPS)])
    env = {"REDIS_URL": REDIS_URL, "Q_NAME": queue_name, "Q_WORKERS": "2"}
    clusters = [workers.start("qcluster", module="manage", RELIABILITY_CLUSTER=name, **env) for name in "ab"]
    kick = [
        sys.executable,
        "-c",
        "import django; django.setup(); from django_q.tasks import async_task;"
        "[async_task('cleanup.tasks.tick_task') for _ in range(4)]",
    ]

    def done():
        return not Run.objects.exclude(status="completed", cleanup_status="complete").exists()

    on_redis = redis.from_url(REDIS_URL)
    seen_on_redis = set()
    deadline = time.monotonic() + 150
    while not done():
        # What the schedule does once a minute, every two seconds: each tick that reaches a
        # bound queues the next itself.
        subprocess.run(kick, cwd=settings.BASE_DIR, env=workers.env(**env), check=True, timeout=60)
        assert all(workers.alive(c) for c in clusters), "a cluster died"
        assert time.monotonic() < deadline, "the clusters did not finish the runs in time"
        time.sleep(2)
        # Each cluster posts its status under the queue's name: proof that they work on Redis.
        seen_on_redis.update(k.decode() for k in on_redis.scan_iter(f"django_q:{queue_name}:cluster*"))
    for cluster in clusters:
        cluster.send_signal(signal.SIGTERM)
    for cluster in clusters:
        workers.wait(cluster, timeout=60)

    assert len(seen_on_redis) >= 2, f"the clusters did not both show up on Redis: {seen_on_redis}"
    calls = workers.read_calls()
    performed = Counter(c["key"] for c in calls if c["verb"] == "perform")
    assert performed == Counter(Step.objects.values_list("idempotency_key", flat=True)), "a step was performed twice"
    reverted = Counter(ref for c in calls if c["verb"] == "revert" for ref in c["refs"])
    assert reverted == Counter(Resource.objects.exclude(kind="step").values_list("ref", flat=True))
    assert set(reverted.values()) == {1}, "a row was given back twice"
    assert {c["cluster"] for c in calls} == {"a", "b"}, "one cluster did all the work"
    assert set(Step.objects.values_list("status", "attempts")) == {("done", 1)}
    assert workers.overlaps() == []
