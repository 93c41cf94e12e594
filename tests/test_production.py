"""The site in production: the README's environment passes `check --deploy`, gunicorn serves
it with WhiteNoise, `/healthz` tells a load balancer whether it can work, failures are logged."""

import asyncio
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from datetime import timedelta
from unittest import mock

import httpx
import pytest
import time_machine
from django.conf import settings
from django.core.management import call_command
from django.db import OperationalError, connection
from django.test import Client
from django.utils import timezone
from django_q.models import Schedule, Success
from django_q.scheduler import scheduler
from django_q.tasks import async_task

from cleanup.tasks import SCHEDULE_NAME, ensure_schedule
from tests.test_api_access import user_with

ROOT = settings.BASE_DIR
MANAGE = [sys.executable, str(ROOT / "manage.py")]


def documented_environment():
    """The variables the README's "Running in production" section exports, as it gives them."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Running in production", 1)[1].split("\n## ", 1)[0]
    env = {}
    for line in section.splitlines():
        match = re.fullmatch(r"\s+export (\w+)=(.*)", line)
        if match:
            name, value = match.groups()
            (value,) = shlex.split(value) if "$(" not in value else [None]
            env[name] = value
    assert {"SECRET_KEY", "ALLOWED_HOSTS", "SECURE_SSL_REDIRECT", "SECURE_HSTS_SECONDS"} <= set(env), env
    # The command it gives for the key, run as the shell would.
    command = re.search(r"export SECRET_KEY=\"\$\((.*)\)\"", section).group(1)
    env["SECRET_KEY"] = subprocess.run(shlex.split(command), capture_output=True, text=True, check=True).stdout.strip()
    return env


def site_environment(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SECURE_", "DJANGO_SETTINGS"))}
    return {**env, "DJANGO_SETTINGS_MODULE": "eventsite.settings", **extra}


@pytest.mark.slow
def test_it_passes_check_deploy_with_the_documented_environment():
    env = site_environment(**documented_environment())
    result = subprocess.run(
        [*MANAGE, "check", "--deploy", "--fail-level", "WARNING"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout


@pytest.mark.slow
def test_check_deploy_warns_without_the_https_settings():
    env = site_environment(DEBUG="0", SECRET_KEY=documented_environment()["SECRET_KEY"], ALLOWED_HOSTS="x.example")
    result = subprocess.run(
        [*MANAGE, "check", "--deploy", "--fail-level", "WARNING"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert {"security.W004", "security.W008", "security.W012", "security.W016"} <= set(
        re.findall(r"security\.W\d+", result.stderr + result.stdout)
    )


# -- /healthz -------------------------------------------------------------------------------


def cluster_ran_the_tick(ago_s):
    """django-q2's scheduler fires the due tick ``ago_s`` ago, as a cluster does. With the
    tests' ``sync`` on, the task runs there and then and its result is saved as a
    worker's would be: in the schedule's group, with the time it stopped."""
    at = timezone.now() - timedelta(seconds=ago_s)
    schedule = ensure_schedule()
    Schedule.objects.filter(pk=schedule.pk).update(next_run=at - timedelta(seconds=1))
    with time_machine.travel(at, tick=False):
        scheduler()
    assert Success.objects.filter(group=SCHEDULE_NAME, stopped=at).exists(), "the scheduler did not run the tick"


@pytest.mark.django_db
def test_healthz_is_ok_when_the_database_answers_and_a_cluster_ran_the_tick_recently(client):
    cluster_ran_the_tick(ago_s=50)
    response = client.get("/healthz")
    assert (response.status_code, response.content) == (200, b"ok\n")
    assert "no-cache" in response["Cache-Control"]


@pytest.mark.django_db
def test_healthz_is_503_when_the_last_tick_ran_too_long_ago(client):
    cluster_ran_the_tick(ago_s=600)
    response = client.get("/healthz")
    assert (response.status_code, response.content) == (503, b"not ok\n")


@pytest.mark.django_db
def test_healthz_is_503_after_migrate_until_a_cluster_runs_the_tick(client):
    # `migrate` made the schedule, due now: only a cluster running it makes the site healthy.
    call_command("migrate", verbosity=0)
    assert Schedule.objects.filter(name=SCHEDULE_NAME).exists()
    assert client.get("/healthz").status_code == 503
    cluster_ran_the_tick(ago_s=1)
    assert client.get("/healthz").status_code == 200


@pytest.mark.django_db
def test_healthz_counts_neither_a_failed_tick_nor_other_tasks(client):
    cluster_ran_the_tick(ago_s=600)
    recent = timezone.now() - timedelta(seconds=10)
    Success.objects.update(stopped=recent, success=False)  # the tick failed: nothing advanced
    async_task("cleanup.tasks.sweep_task")  # another task, run now
    assert Success.objects.filter(func="cleanup.tasks.sweep_task").exists()
    assert client.get("/healthz").status_code == 503


@pytest.mark.django_db
def test_healthz_is_503_without_a_schedule(client):
    cluster_ran_the_tick(ago_s=10)
    Schedule.objects.filter(name=SCHEDULE_NAME).delete()
    assert client.get("/healthz").status_code == 503


@pytest.mark.django_db
def test_healthz_is_503_when_the_database_does_not_answer(client):
    cluster_ran_the_tick(ago_s=0)
    with mock.patch.object(connection, "cursor", side_effect=OperationalError("connection refused")):
        response = client.get("/healthz")
    assert (response.status_code, response.content) == (503, b"not ok\n")


# -- the site's front doors -----------------------------------------------------------------


@pytest.mark.django_db
def test_the_root_leads_to_the_admin(client):
    for method in ("GET", "HEAD"):
        response = client.generic(method, "/")
        assert response.status_code == 302 and response["Location"] == "/admin/", method


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "DISPATCH", "FROB"])
def test_healthz_and_the_root_answer_405_to_any_method_but_get_and_head(method):
    # As a browser or a probe meets the site: with the CSRF check on, which answers 403
    # to an unsafe method on a view that does not say it needs no token.
    client = Client(enforce_csrf_checks=True)
    for path in ("/healthz", "/"):
        response = client.generic(method, path)
        assert (response.status_code, response["Allow"]) == (405, "GET, HEAD"), path


@pytest.mark.django_db
def test_the_docs_page_answers_405_not_500_to_options():
    client = Client(raise_request_exception=False)
    client.force_login(user_with(username="staff"))
    response = client.options("/api/docs/")
    assert response.status_code == 405 and "OPTIONS" not in response["Allow"]
    assert response.json() == {"code": "method_not_allowed", "detail": "Method not allowed."}


@pytest.mark.django_db
def test_the_schema_and_the_docs_page_are_for_staff_and_load_nothing_from_a_cdn(client):
    for path in ("/api/schema/", "/api/docs/"):
        assert client.get(path).status_code in (401, 403), path
    client.force_login(user_with(username="clerk", staff=False))
    assert client.get("/api/docs/").status_code == 403
    client.force_login(user_with(username="staff"))
    assert client.get("/api/schema/").status_code == 200
    page = client.get("/api/docs/").content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in page
    assert not re.search(r"(src|href)=\"https?://", page), "the docs page loads something from the network"


FAIL_A_REQUEST = """
import logging
from unittest import mock

import django
from django.test import Client

django.setup()
print(sorted(type(h).__name__ for h in logging.getLogger("django.request").handlers))
with mock.patch("cleanup.sitecheck.healthy", side_effect=RuntimeError("the disk is on fire")):
    print(Client(raise_request_exception=False).get("/healthz").status_code)
"""


def fail_a_request(**env):
    """In a fresh process with the site's own logging: its handlers, and a request that fails."""
    env = site_environment(DEBUG="0", SECRET_KEY="x" * 50, ALLOWED_HOSTS="testserver", **env)
    return subprocess.run(
        [sys.executable, "-c", FAIL_A_REQUEST],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


@pytest.mark.slow
def test_a_failing_request_is_logged_with_its_traceback_on_stderr_and_mailed_only_when_configured():
    result = fail_a_request()
    assert result.stdout.split("\n")[:2] == ["['StreamHandler']", "500"]
    assert "ERROR django.request Internal Server Error: /healthz" in result.stderr
    assert "Traceback" in result.stderr and "RuntimeError: the disk is on fire" in result.stderr
    mailed = fail_a_request(ADMINS="ops@example.com", EMAIL_HOST="127.0.0.1", EMAIL_PORT="9")
    # Mailed by the cluster: the request only queues the mail (cleanup.errormail).
    assert mailed.stdout.startswith("['QueuedAdminEmailHandler', 'StreamHandler']")


# -- gunicorn -------------------------------------------------------------------------------


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def documented_gunicorn():
    """The README's gunicorn command, as it gives it (its arguments after the program)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Running in production", 1)[1].split("\n## ", 1)[0]
    command = re.search(r"\.venv/bin/gunicorn (.*)", section.replace("\\\n", " ")).group(1)
    return shlex.split(command)


def start_gunicorn(tmp_path, env, port, workers="1"):
    """gunicorn as the README starts it, on ``port`` with ``workers`` workers."""
    arguments = documented_gunicorn()
    assert "uvicorn_worker.UvicornWorker" in arguments and arguments[0] == "eventsite.asgi:application"
    arguments[arguments.index("--bind") + 1] = f"127.0.0.1:{port}"
    arguments[arguments.index("--workers") + 1] = workers
    log = (tmp_path / "gunicorn.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", *arguments], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    return process, log


def first_healthz(base, process, tmp_path):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        try:
            return httpx.get(f"{base}/healthz", timeout=5)
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError((tmp_path / "gunicorn.log").read_text())


def database_url():
    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_gunicorn_serves_healthz_and_static_files_with_the_documented_environment(tmp_path):
    cluster_ran_the_tick(ago_s=0)
    static = tmp_path / "static"
    static.mkdir()
    (static / "probe.txt").write_text("served by whitenoise")
    port = free_port()
    env = site_environment(
        **{
            **documented_environment(),
            "ALLOWED_HOSTS": "127.0.0.1",
            "DATABASE_URL": database_url(),
            "STATIC_ROOT": str(static),
        }
    )
    process, log = start_gunicorn(tmp_path, env, port)
    try:
        base = f"http://127.0.0.1:{port}"
        response = first_healthz(base, process, tmp_path)
        assert (response.status_code, response.text) == (200, "ok\n")
        static_file = httpx.get(f"{base}/static/probe.txt", timeout=5, headers={"X-Forwarded-Proto": "https"})
        assert (static_file.status_code, static_file.text) == (200, "served by whitenoise")
        # Everything but /healthz goes to HTTPS.
        assert httpx.get(f"{base}/admin/", timeout=5).status_code == 301
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()


@pytest.mark.django_db
def test_a_burst_of_other_task_results_keeps_the_last_ticks_result(monkeypatch):
    """django-q2 prunes its kept results per task function: /healthz's tick stays readable."""
    from datetime import timedelta

    from django.utils import timezone
    from django_q.brokers import get_broker
    from django_q.conf import Conf
    from django_q.models import Success
    from django_q.monitor import save_task

    monkeypatch.setattr(Conf, "SAVE_LIMIT", 3)
    start = timezone.now()

    def result(n, func):
        at = start + timedelta(seconds=n)
        return {
            "id": f"task-{n}",
            "name": f"task {n}",
            "func": func,
            "args": (),
            "kwargs": {},
            "started": at,
            "stopped": at,
            "result": None,
            "group": None,
            "success": True,
            "sync": True,
        }

    save_task(result(0, "cleanup.tasks.tick_task"), get_broker())
    for n in range(1, 8):
        save_task(result(n, "cleanup.tasks.cleanup_run_task"), get_broker())

    assert Success.objects.filter(func="cleanup.tasks.tick_task").count() == 1
    assert Success.objects.filter(func="cleanup.tasks.cleanup_run_task").count() == 3


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_consoles_waiting_on_the_feed_hold_no_worker_under_the_documented_recipe(tmp_path):
    """One worker, more waiting consoles than any thread pool: /healthz and a list still
    answer while they wait, and each console is told of the change, as JSON."""
    from cleanup.api.tokens import issue
    from cleanup.feed import position
    from cleanup.models import RunLog, RunStatus
    from tests.fakes import make_run

    cluster_ran_the_tick(ago_s=0)
    run = make_run(status=RunStatus.RUNNING, name="raid")
    _, key = issue(user_with("view_runlog", "view_moduleevent", "view_run", username="console"))
    since = position()
    port = free_port()
    env = site_environment(
        **{
            **documented_environment(),
            "ALLOWED_HOSTS": "127.0.0.1",
            "DATABASE_URL": database_url(),
            "SECURE_SSL_REDIRECT": "0",
            "API_THROTTLE_READS": "off",
        }
    )
    process, log = start_gunicorn(tmp_path, env, port)
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Token {key}"}
    try:
        first_healthz(base, process, tmp_path)

        async def consoles():
            limits = httpx.Limits(max_connections=100)
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=40, limits=limits) as client:
                polls = [
                    asyncio.create_task(client.get("/api/v1/events/changes/", params={"after": since, "wait": 30}))
                    for _ in range(40)
                ]
                await asyncio.sleep(2)
                assert not any(p.done() for p in polls), [p.result().text for p in polls if p.done()]
                healthz = await client.get("/healthz")
                runs = await client.get("/api/v1/events/runs/")
                still_waiting = sum(not p.done() for p in polls)
                await asyncio.to_thread(RunLog.write, run.pk, "run.cancelled", by="ann")
                answers = await asyncio.gather(*polls)
                return healthz, runs, still_waiting, answers

        healthz, runs, still_waiting, answers = asyncio.run(consoles())
        assert (healthz.status_code, runs.status_code) == (200, 200)
        assert still_waiting == 40, "the list and /healthz were answered while every console waited"
        assert {a.status_code for a in answers} == {200}
        assert all(a.headers["Content-Type"] == "application/json" for a in answers)
        assert all([e["kind"] for e in a.json()] == ["run.cancelled"] for a in answers)
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()
