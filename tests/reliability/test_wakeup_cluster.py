"""With a real django-q2 cluster, idle, on the ORM broker and on Redis: a 2-second
``core.wait`` ends within 4 s, not at the next minute tick, and a person's "Mark up"
resumes the steps and rows that waited on the backend within seconds (issue 21, item 7).

django-q2's scheduler looks only every 30 s and the tick's schedule runs once a minute:
without the engine's own wake-up (`cleanup.wakeup`) these take tens of seconds.
"""

import os
import subprocess
import sys
import time
from datetime import timedelta
from unittest import mock

import pytest
import redis
from django.conf import settings
from django_q.models import Success

from cleanup import outages, registry
from cleanup.enqueue import WAKE
from cleanup.models import ModuleEvent, Resource, ResourceState, Run, RunStatus, Step, StepStatus
from cleanup.runner import start_run
from tests.fakes import make_rows, make_run, make_step
from tests.reliability.harness import PG_PROCESSES
from tests.reliability.recorder.module import Spawn

REDIS_URL = os.environ.get("RELIABILITY_REDIS_URL", "redis://127.0.0.1:6379/9")


def redis_answers():
    try:
        return redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError:
        return False


pytestmark = PG_PROCESSES

BROKERS = [
    pytest.param("orm", id="orm"),
    pytest.param(
        "redis", id="redis", marks=pytest.mark.skipif(not redis_answers(), reason=f"needs Redis at {REDIS_URL}")
    ),
]


@pytest.fixture(params=BROKERS)
def cluster_env(request):
    name = f"wakeup-{os.getpid()}"
    env = {"Q_NAME": name, "Q_WORKERS": "2", "LOG_LEVEL": "INFO"}
    if request.param == "redis":
        env["REDIS_URL"] = REDIS_URL
    yield env
    if request.param == "redis":
        connection = redis.from_url(REDIS_URL)
        for key in connection.scan_iter(f"django_q:{name}:*"):
            connection.delete(key)


def as_the_site(workers, env, code):
    """Run ``code`` in a process of the site (not in django-q2's sync mode, as the tests are)."""
    script = f"import django; django.setup()\n{code}"
    subprocess.run(
        [sys.executable, "-c", script], cwd=settings.BASE_DIR, env=workers.env(**env), check=True, timeout=60
    )


def started_cluster(workers, env):
    cluster = workers.start("qcluster", module="manage", **env)
    # A tick queued through the broker: the cluster's first one, whenever it is ready.
    as_the_site(workers, env, "from cleanup.tasks import queue_tick; queue_tick()")
    return cluster


def wait_for(workers, cluster, predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert workers.alive(cluster), f"the cluster died:\n{workers.output(cluster)}"
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}:\n{workers.output(cluster)}"
        time.sleep(0.1)


def test_a_two_second_wait_ends_within_four_seconds_with_an_idle_cluster(workers, cluster_env):
    with mock.patch("cleanup.runner.queue_tick"):  # the cluster does the ticking, not this process
        run = start_run("short wait", [{"action": "core.wait", "params": {"seconds": 2}}])
    cluster = started_cluster(workers, cluster_env)

    wait_for(workers, cluster, lambda: Run.objects.get(pk=run.pk).status != RunStatus.RUNNING, 60, "the run to end")

    run.refresh_from_db()
    wait = run.steps.get()
    assert (run.status, wait.status) == (RunStatus.COMPLETED, StepStatus.DONE)
    waited = (wait.finished_at - wait.started_at).total_seconds()
    assert 2 <= waited <= 4, f"a 2-second wait took {waited:.1f} s"
    # The wake task's result is saved once it returns, a moment after the run ended in it.
    woke = Success.objects.filter(func=WAKE)
    wait_for(workers, cluster, woke.exists, 10, "the wake task's result (the wait did not end by the wake-up?)")
    assert woke.filter(started__lte=wait.finished_at).exists()


def test_a_persons_mark_up_resumes_the_held_step_and_the_waiting_rows_within_seconds(workers, cluster_env):
    registry.register_action(Spawn())
    outages.mark_down("rel", by="alice", reason="maintenance")
    ended = make_run(status=RunStatus.COMPLETED)
    for position in range(3):
        make_rows(make_step(ended, action_id="rel.spawn", position=position), [f"orc-{position}"], module="rel")
    with mock.patch("cleanup.runner.queue_tick"):
        held = start_run("held", [{"action": "rel.spawn", "params": {"count": 1}}])
    cluster = started_cluster(workers, cluster_env)
    step = held.steps.get()
    wait_for(
        workers,
        cluster,
        lambda: Step.objects.filter(pk=step.pk, waiting_since__isnull=False).exists(),
        60,
        "the cluster to hold the step while rel is down",
    )
    time.sleep(2)  # the cluster idle, the backend held down

    as_the_site(workers, cluster_env, "from cleanup import outages; outages.mark_up('rel', by='alice')")
    # From the moment of the mark-up, as the modules' log has it (not the start of the process that made it).
    marked_up = ModuleEvent.objects.get(module="rel", kind="module.up").at

    def resumed():
        done = Step.objects.filter(pk=step.pk, status=StepStatus.DONE).exists()
        rows = Resource.objects.filter(run=ended).exclude(kind="step")
        return done and not rows.exclude(state=ResourceState.REVERTED).exists()

    wait_for(workers, cluster, resumed, 60, "the step and the rows to resume")
    step.refresh_from_db()
    after_step = (step.finished_at - marked_up).total_seconds()
    last_row = max(Resource.objects.filter(run=ended).exclude(kind="step").values_list("resolved_at", flat=True))
    after_rows = (last_row - marked_up).total_seconds()
    assert after_step <= 5, f"the held step resumed {after_step:.1f} s after the mark-up"
    # The rows resume spread over EVENT_OUTAGE_SPREAD_S (5 s): the last bucket a moment later.
    assert after_rows <= 5 + 3, f"the waiting rows were given back {after_rows:.1f} s after the mark-up"
    assert timedelta(0) < step.finished_at - marked_up
