"""The counters every process shares: the API's throttle, the failed-token lockout and the error
mail's bound count one limit across processes (the database cache without Redis, Redis with
it), never per process; `check --deploy` warns when the counters' cache is a process's own."""

import json
import os
import socket
import subprocess
import sys
import uuid

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from cleanup import limits

ROOT = settings.BASE_DIR

pytestmark = pytest.mark.django_db

PROCESS = """
import json, logging, sys
import django
django.setup()
from types import SimpleNamespace
from rest_framework import exceptions
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory
from cleanup import errormail
from cleanup.api.throttles import EventsThrottle
from cleanup.api.tokens import TokenAuthentication

what, address, *keys = sys.argv[1:]
out = []
for key in keys:
    raw = APIRequestFactory().get("/api/v1/events/runs/", REMOTE_ADDR=address, HTTP_AUTHORIZATION="Token " + key)
    if what == "token":
        try:
            TokenAuthentication().authenticate(Request(raw))
            out.append(200)
        except exceptions.Throttled:
            out.append(429)
        except exceptions.AuthenticationFailed:
            out.append(401)
    elif what == "read":
        request = Request(raw)
        request.user = SimpleNamespace(pk=int(key), is_authenticated=True)
        out.append(200 if EventsThrottle().allow_request(request, SimpleNamespace()) else 429)
    else:
        text = "Internal Server Error: %s"
        record = logging.LogRecord("django.request", logging.ERROR, "x.py", 1, text, (key,), None)
        out.append(errormail.first_in_interval(record))
print("RESULT " + json.dumps(out))
"""


def redis_answers():
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5):
            return True
    except OSError:
        return False


def url_of_the_test_database():
    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture(params=["database", "redis"])
def site(request):
    """Run ``PROCESS`` in a process of its own, as a worker of the site would be, on the
    counters' cache the site's settings pick: the database's, or Redis's when REDIS_URL is set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_SETTINGS", "REDIS_URL"))}
    env.update(
        DJANGO_SETTINGS_MODULE="eventsite.settings",
        DEBUG="1",
        SECRET_KEY="tests-only-secret-key-not-for-deployment-0123456789",
        DATABASE_URL=url_of_the_test_database(),
        EVENT_TOKEN_FAILURE_LIMIT="20",
        API_THROTTLE_READS="5/min",
        Q_NAME=f"counters-{uuid.uuid4().hex[:8]}",
    )
    if request.param == "redis":
        if not redis_answers():
            pytest.skip("no Redis at 127.0.0.1:6379")
        env["REDIS_URL"] = "redis://127.0.0.1:6379/0"

    def run(what, address, *keys):
        done = subprocess.run(
            [sys.executable, "-c", PROCESS, what, address, *keys],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and lines, done.stderr
        return json.loads(lines[-1].removeprefix("RESULT "))

    return run


def guesses(start, count):
    return [f"{n:064x}" for n in range(start, start + count)]


@pytest.mark.slow
def test_failed_tokens_counted_by_two_processes_trip_the_lockout_at_the_twentieth(site):
    address = f"10.{uuid.uuid4().int % 250}.7.7"
    assert site("token", address, *guesses(0, 10)) == [401] * 10
    assert site("token", address, *guesses(10, 10)) == [401] * 10
    # A third process sees the twenty failures of the other two.
    assert site("token", address, *guesses(20, 1)) == [429]


@pytest.mark.slow
def test_one_users_reads_in_two_processes_count_against_one_rate(site):
    user = str(100_000 + uuid.uuid4().int % 100_000)
    assert site("read", "10.0.0.1", user, user, user) == [200, 200, 200]
    assert site("read", "10.0.0.1", user, user, user) == [200, 200, 429]


@pytest.mark.slow
def test_an_error_is_mailed_once_per_interval_whichever_process_logs_it(site):
    path = f"/boom-{uuid.uuid4().hex}"
    assert site("mail", "10.0.0.1", path) == [True]
    assert site("mail", "10.0.0.1", path, path) == [False, False]


POOLS = """
import json, threading
import django
django.setup()
from django.core.cache import caches

pools, values = [], []

def as_a_request_would(n):
    # Django makes a cache object per thread, and per request under ASGI.
    cache = caches["counters"]
    cache.set(f"pool-probe-{n}", n, 30)
    values.append(cache.get(f"pool-probe-{n}"))
    pools.append(cache._cache._get_connection_pool(True))

for n in range(8):
    thread = threading.Thread(target=as_a_request_would, args=(n,))
    thread.start()
    thread.join()
print("RESULT " + json.dumps({"pools": len({id(p) for p in pools}), "made": len(pools[0]._connections),
                             "values": sorted(values)}))
"""


def result_on_redis(script, name):
    """What ``script`` prints after ``RESULT `` (JSON), run in a process of its own with the
    site's settings, the counters on Redis under a queue name of its own."""
    if not redis_answers():
        pytest.skip("no Redis at 127.0.0.1:6379")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_SETTINGS")}
    env.update(
        DJANGO_SETTINGS_MODULE="eventsite.settings",
        DEBUG="1",
        DATABASE_URL=url_of_the_test_database(),
        REDIS_URL="redis://127.0.0.1:6379/0",
        Q_NAME=f"{name}-{uuid.uuid4().hex[:8]}",
    )
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.slow
def test_on_redis_the_counters_use_one_connection_pool_a_process_not_one_a_request():
    """Eight requests of one worker, each with its own cache object, as under ASGI, share the
    process's pool and its one connection (each opened a connection of its own before)."""
    assert result_on_redis(POOLS, "pools") == {"pools": 1, "made": 1, "values": list(range(8))}


BURST = """
import json, threading
import django
django.setup()
from django.core.cache import caches
start, failures = threading.Barrier(120), []

def as_a_request_would(n):
    cache = caches["counters"]
    start.wait()
    try:
        # Holds its connection 0.2 s, as a slow Redis would: 120 at once, for 50 connections.
        cache._cache.get_client(write=True).blpop(["pool-burst-nothing"], timeout=0.2)
        cache.incr("pool-burst", 1)
    except Exception as exc:
        failures.append(type(exc).__name__)

caches["counters"].set("pool-burst", 0, 30)
threads = [threading.Thread(target=as_a_request_would, args=(n,)) for n in range(120)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("RESULT " + json.dumps({"failures": failures, "count": caches["counters"].get("pool-burst")}))
"""


@pytest.mark.slow
def test_on_redis_a_burst_of_more_requests_than_connections_waits_for_one_and_counts_every_one():
    """120 requests at once against a pool of 50 (`SharedRedisPool.MAX_CONNECTIONS`): each
    waits for a connection and is counted. (redis-py's default pool refuses past its size at
    once, and the counters then fail open: a burst went uncounted, throttle and lockout too.)"""
    assert result_on_redis(BURST, "burst") == {"failures": [], "count": 120}


def test_the_sites_counters_are_on_a_cache_every_process_shares():
    assert limits.alias() == "counters"
    assert limits.per_process() is None
    expected = "RedisCache" if os.environ.get("REDIS_URL") else "CountersCache"
    assert settings.CACHES["counters"]["BACKEND"].endswith(expected)
    # The database cache's table exists once migrated: nothing more to run.
    assert limits.TABLE in connection.introspection.table_names()


def deploy_check_ids():
    from io import StringIO

    from django.core.management.base import SystemCheckError

    out = StringIO()
    try:
        call_command("check", "--deploy", stdout=out, stderr=out)
    except SystemCheckError as error:
        return str(error) + out.getvalue()
    return out.getvalue()


@pytest.mark.parametrize(
    "backend", ["django.core.cache.backends.locmem.LocMemCache", "django.core.cache.backends.dummy.DummyCache"]
)
def test_check_deploy_warns_when_the_counters_are_kept_per_process(backend):
    caches = {**settings.CACHES, "counters": {"BACKEND": backend}}
    with override_settings(CACHES=caches):
        assert limits.per_process() == backend
        assert "cleanup.W031" in deploy_check_ids()
    assert "cleanup.W031" not in deploy_check_ids()


def test_the_database_counters_set_add_and_expire_as_a_cache_should():
    from datetime import timedelta

    import time_machine
    from django.utils import timezone

    counts = limits.CountersCache(limits.TABLE, {})
    counts.set("k", [1.0, 2.0], 30)
    assert counts.get("k") == [1.0, 2.0]
    counts.set("k", [3.0], 30)
    assert counts.get("k") == [3.0]
    # An add leaves a live entry alone, and takes the place of an expired one.
    assert counts.add("k", "other", 30) is False and counts.get("k") == [3.0]
    assert counts.add("fresh", 1, 30) is True and counts.get("fresh") == 1
    with time_machine.travel(timezone.now() + timedelta(seconds=31), tick=False):
        assert counts.get("k") is None
        assert counts.add("k", "again", 30) is True
        assert counts.get("k") == "again"
    counts.set_many({"a": 1, "b": 2}, 30)
    assert counts.get_many(["a", "b", "c"]) == {"a": 1, "b": 2}
