"""Headers and sessions: a Content-Security-Policy on every page with no inline script,
``Cache-Control: no-store`` on API answers, sessions bounded overall and when idle, and
django-q2's schedules and tasks changed by superusers only."""

import re
from datetime import timedelta
from html.parser import HTMLParser

import pytest
import time_machine
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone
from django_q.models import Schedule

from tests.fakes import make_rows, make_run, make_step
from tests.test_api_access import api_as

pytestmark = pytest.mark.django_db


@pytest.fixture
def root():
    user = User.objects.create_superuser("root", password="pw-123456789")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def run(world):
    run = make_run(name="raid")
    make_rows(make_step(run), ["r1", "r2"])
    return run


def policy(answer):
    header = answer["Content-Security-Policy"]
    return {part.split()[0]: part.split()[1:] for part in header.split(";") if part.strip()}


class Scripts(HTMLParser):
    def __init__(self):
        super().__init__()
        self.inline = []
        self.handlers = []
        self._open = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.handlers += [name for name in attrs if name.startswith("on")]
        if any(value and value.strip().lower().startswith("javascript:") for value in attrs.values()):
            self.handlers.append("javascript: URL")
        if tag == "script" and "src" not in attrs and attrs.get("type") not in ("application/json",):
            self._open = []

    def handle_data(self, data):
        if self._open is not None:
            self._open.append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._open is not None:
            self.inline.append("".join(self._open).strip()[:80])
            self._open = None


def pages(run):
    return [
        "/admin/",
        "/admin/cleanup/run/",
        f"/admin/cleanup/run/{run.pk}/change/",
        "/admin/cleanup/resource/",
        "/admin/cleanup/modulehealth/",
        "/admin/django_q/schedule/",
        "/admin/auth/user/add/",
        "/api/docs/",
    ]


def test_every_page_has_the_policy_and_no_inline_script(root, run):
    for path in [*pages(run), "/admin/login/"]:
        answer = root.get(path) if path != "/admin/login/" else Client().get(path)
        assert answer.status_code == 200, path
        directives = policy(answer)
        assert directives["script-src"] == ["'self'"], path
        assert directives["object-src"] == ["'none'"] and directives["frame-ancestors"] == ["'none'"], path
        assert directives["default-src"] == ["'self'"], path
        parsed = Scripts()
        parsed.feed(answer.content.decode())
        assert parsed.inline == [] and parsed.handlers == [], path


def test_the_docs_page_loads_its_start_script_from_the_site(root):
    page = root.get("/api/docs/").content.decode()
    sources = re.findall(r'<script src="([^"]+)"', page)
    assert sources and all(src.startswith("/") for src in sources)
    start = [src for src in sources if "script" in src.split("?", 1)[-1]]
    assert start, sources
    script = root.get(start[0].replace("&amp;", "&"))
    assert script.status_code == 200 and "SwaggerUIBundle" in script.content.decode()


def test_the_api_answers_carry_the_policy_and_are_never_stored(run):
    client = api_as("view_run")
    for path in ("/api/events/runs/", f"/api/events/runs/{run.pk}/", "/api/events/nothing/", "/api/schema/"):
        answer = client.get(path)
        assert "no-store" in answer["Cache-Control"], path
        assert "Content-Security-Policy" in answer, path
    assert "no-store" in Client().get("/api/events/runs/")["Cache-Control"]  # a 401 too


def test_a_session_lasts_eight_hours_at_most():
    assert settings.SESSION_COOKIE_AGE == 8 * 3600
    User.objects.create_user("operator", password="pw-123456789", is_staff=True)
    client = Client()
    answer = client.post("/admin/login/", {"username": "operator", "password": "pw-123456789", "next": "/admin/"})
    assert answer.status_code == 302
    assert client.cookies[settings.SESSION_COOKIE_NAME]["max-age"] == 8 * 3600
    with time_machine.travel(timezone.now() + timedelta(hours=8, minutes=1)):
        assert client.get("/admin/").status_code == 302  # to the login page


def test_a_session_idle_longer_than_the_timeout_is_logged_out(root):
    assert settings.SESSION_IDLE_TIMEOUT == 3600
    now = timezone.now()
    assert root.get("/admin/").status_code == 200
    with time_machine.travel(now + timedelta(minutes=50)):
        assert root.get("/admin/").status_code == 200
    with time_machine.travel(now + timedelta(minutes=100)):  # 50 minutes after the last request
        assert root.get("/admin/").status_code == 200
    with time_machine.travel(now + timedelta(minutes=161)):  # 61 minutes idle
        assert root.get("/admin/").status_code == 302
        assert root.get("/admin/").status_code == 302  # logged out for good


def test_a_live_page_left_open_does_not_keep_its_session_alive(root, run):
    """The fragments a live page reads by itself every few seconds are not a person's activity."""
    now = timezone.now()
    fragments = (
        "/admin/cleanup/run/live-index/",
        f"/admin/cleanup/run/{run.pk}/live/",
        "/admin/cleanup/resource/live/",
    )
    assert root.get("/admin/").status_code == 200
    for minute in range(1, 60, 3):  # the page refreshes itself all hour long
        with time_machine.travel(now + timedelta(minutes=minute)):
            for path in fragments:
                assert root.get(path).status_code == 200, path
    with time_machine.travel(now + timedelta(minutes=61)):  # no person for 61 minutes
        answer = root.get(fragments[1])
        assert answer.status_code == 302 and "/admin/login/" in answer["Location"]
        assert root.get("/admin/").status_code == 302


def test_a_person_on_the_page_keeps_the_session_alive_while_it_refreshes(root, run):
    now = timezone.now()
    assert root.get("/admin/").status_code == 200
    with time_machine.travel(now + timedelta(minutes=50)):
        assert root.get(f"/admin/cleanup/run/{run.pk}/change/").status_code == 200  # a person clicks
    with time_machine.travel(now + timedelta(minutes=100)):
        assert root.get(f"/admin/cleanup/run/{run.pk}/live/").status_code == 200
        assert root.get("/admin/").status_code == 200


def django_q_staff():
    user = User.objects.create_user("scheduler", password="pw-123456789", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_q"))
    client = Client()
    client.force_login(user)
    return client


def test_only_a_superuser_adds_or_changes_a_schedule(root):
    schedule = Schedule.objects.create(name="tick", func="cleanup.tasks.tick_task")
    staff = django_q_staff()
    assert staff.get("/admin/django_q/schedule/").status_code == 200  # may read
    assert staff.get("/admin/django_q/schedule/add/").status_code == 403
    answer = staff.post(
        "/admin/django_q/schedule/add/",
        {"name": "evil", "func": "os.system", "args": "'id'", "schedule_type": "O", "repeats": -1},
    )
    assert answer.status_code == 403
    answer = staff.post(f"/admin/django_q/schedule/{schedule.pk}/change/", {"func": "os.system"})
    assert answer.status_code == 403
    assert staff.post(f"/admin/django_q/schedule/{schedule.pk}/delete/", {"post": "yes"}).status_code == 403
    assert list(Schedule.objects.filter(pk=schedule.pk).values_list("func", flat=True)) == ["cleanup.tasks.tick_task"]
    assert not Schedule.objects.filter(func="os.system").exists()
    assert root.get("/admin/django_q/schedule/add/").status_code == 200


def test_staff_cannot_resubmit_a_task(root):
    from django_q.models import Failure, OrmQ

    failure = Failure.objects.create(
        id="a" * 32,
        name="x",
        func="math.floor",
        args=(1.5,),
        success=False,
        started=timezone.now(),
        stopped=timezone.now(),
    )
    staff = django_q_staff()
    before = OrmQ.objects.count()
    staff.post("/admin/django_q/failure/", {"action": "resubmit_task", "_selected_action": [failure.pk]})
    assert OrmQ.objects.count() == before and Failure.objects.filter(pk=failure.pk).exists()
    assert "resubmit_task" not in staff.get("/admin/django_q/failure/").content.decode()
    assert "resubmit_task" in root.get("/admin/django_q/failure/").content.decode()
