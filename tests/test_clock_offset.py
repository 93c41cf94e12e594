"""Worker clocks (`cleanup.skew`): each cluster's offset from the database's clock is measured,
recorded at its start and on each tick, shown by ``/healthz?detail=1`` and the module health
page, and a system check warns past 5 s."""

import os
import re
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from unittest import mock

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.core import checks
from django.db import OperationalError, connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django_q.signals import post_spawn

from cleanup import skew, tasks
from cleanup.checks import check_clocks_agree_with_the_database
from cleanup.models import WorkerClock

pytestmark = pytest.mark.django_db

ROOT = settings.BASE_DIR
REAL_TIME = time.time


def shifted(seconds):
    """This process's clock, ``seconds`` off (``time.time`` as `cleanup.skew` reads it)."""
    return mock.patch("time.time", lambda: REAL_TIME() + seconds)


def staff(*perms):
    user = User.objects.create_user("clockwatcher", password="pw-123456789", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="cleanup"))
    return user


# -- measuring and recording ----------------------------------------------------------------


@pytest.mark.parametrize("shift", [0, 42.5, -300])
def test_the_offset_measured_is_the_shift_of_the_process_clock(shift):
    with shifted(shift):
        reading = skew.measure()
    assert reading.offset_s == pytest.approx(shift, abs=1)
    assert 0 <= reading.round_trip_s < 1
    assert reading.off == (abs(shift) > 5)


def test_a_cluster_records_its_latest_offset_in_one_statement(django_assert_num_queries):
    with shifted(7.5), django_assert_num_queries(1):
        assert skew.record("eventsite on far") == pytest.approx(7.5, abs=1)
    with shifted(-2):
        skew.record("eventsite on far")  # the latest reading replaces the one before
    (row,) = WorkerClock.objects.all()
    assert (row.who, round(row.offset_s)) == ("eventsite on far", -2)
    assert abs(row.measured_at - timezone.now()) < timedelta(seconds=5)


def test_a_worker_that_starts_and_each_tick_record_this_cluster_s_clock(monkeypatch):
    monkeypatch.setattr(tasks, "_started_in", None)
    with shifted(30):
        post_spawn.send(sender="django_q", proc_name="Process-1:1")
    assert WorkerClock.objects.get(who=skew.who()).offset_s == pytest.approx(30, abs=1)
    tasks.tick_task()
    assert abs(WorkerClock.objects.get(who=skew.who()).offset_s) < 1


def test_a_reading_that_cannot_be_recorded_fails_no_tick(caplog):
    with mock.patch.object(skew, "record", side_effect=OperationalError("the database went away")):
        tasks.record_clock()
    assert "could not record this worker's clock offset" in caplog.text


def test_readings_of_clusters_gone_long_are_not_shown_and_are_pruned():
    WorkerClock.objects.create(who="gone an hour", offset_s=60, measured_at=timezone.now() - timedelta(hours=2))
    WorkerClock.objects.create(who="gone a week", offset_s=60, measured_at=timezone.now() - timedelta(days=8))
    skew.record("here")
    assert [r.who for r in skew.readings()] == ["here"]
    assert skew.forget_old() == 1
    assert sorted(WorkerClock.objects.values_list("who", flat=True)) == ["gone an hour", "here"]


# -- /healthz?detail=1 ------------------------------------------------------------------------


def test_healthz_detail_shows_each_cluster_s_offset_signed_and_when_measured(client):
    with shifted(7.5):
        skew.record("eventsite on far")
    with shifted(-0.3):
        skew.record("eventsite on near")
    client.force_login(staff())
    response = client.get("/healthz?detail=1", REMOTE_ADDR="203.0.113.9")
    body = response.content.decode()
    assert response.status_code == 503 and body.startswith("not ok\n")  # no cluster ticks in a test
    far = re.search(r"^  eventsite on far .*$", body, re.M).group(0)
    near = re.search(r"^  eventsite on near .*$", body, re.M).group(0)
    assert re.match(r"  eventsite on far \+7\.[45] s \(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, measured \d s ago\)", far)
    assert "more than 5 s off" in far
    assert re.match(r"  eventsite on near -0\.[234] s \(", near) and "off" not in near.split(")")[-1]
    assert "claims use the database's clock" in body


def test_healthz_keeps_its_detail_from_strangers_and_its_plain_answer_short():
    skew.record("eventsite on far")
    assert Client().get("/healthz").content == b"not ok\n"
    stranger = Client(REMOTE_ADDR="203.0.113.9").get("/healthz?detail=1")
    assert stranger.status_code == 503 and "eventsite on far" not in stranger.content.decode()
    assert "detail: for staff" in stranger.content.decode()
    # From loopback, as /metrics allows it without its token.
    assert "eventsite on far" in Client().get("/healthz?detail=1").content.decode()


def test_healthz_detail_with_no_reading_says_so():
    body = Client().get("/healthz?detail=1").content.decode()
    assert "none recorded in the last 1 h" in body


# -- the system check -------------------------------------------------------------------------


@pytest.mark.parametrize(("shift", "warned"), [(6.5, True), (-6.5, True), (4, False), (-4, False)])
def test_the_check_warns_when_this_process_clock_is_more_than_5_s_off(shift, warned):
    with shifted(shift):
        found = check_clocks_agree_with_the_database(databases=["default"])
    assert [m.id for m in found] == (["cleanup.W032"] if warned else [])
    if warned:
        (message,) = found
        assert message.level == checks.WARNING
        assert f"{shift:+.0f}." in message.msg and "This process's clock" in message.msg
        assert "use the database's clock" in message.msg and "log lines" in message.msg
        assert "NTP" in message.hint


def test_the_check_warns_of_a_cluster_whose_recent_reading_is_off():
    with shifted(-30):
        skew.record("eventsite on far")
    WorkerClock.objects.create(who="long gone", offset_s=90, measured_at=timezone.now() - timedelta(hours=2))
    (message,) = check_clocks_agree_with_the_database(databases=["default"])
    assert "'eventsite on far'" in message.msg and "-30." in message.msg and "long gone" not in message.msg


def test_the_check_is_a_database_check_run_only_when_asked(django_assert_num_queries):
    registered = [c for c in checks.registry.registry.get_checks() if c is check_clocks_agree_with_the_database]
    assert registered and checks.Tags.database in registered[0].tags
    with shifted(60), django_assert_num_queries(0):
        assert check_clocks_agree_with_the_database(databases=None) == []
    with shifted(60):
        found = checks.run_checks(tags=[checks.Tags.database], databases=["default"])
    assert "cleanup.W032" in [m.id for m in found]


def test_the_check_says_nothing_when_the_database_does_not_answer():
    with shifted(60), mock.patch.object(connection, "cursor", side_effect=OperationalError("connection refused")):
        assert check_clocks_agree_with_the_database(databases=["default"]) == []


# -- the module health page -------------------------------------------------------------------


def test_the_module_health_page_shows_each_cluster_s_clock_and_flags_one_far_off(client):
    with shifted(12.3):
        skew.record("eventsite on far")
    skew.record("eventsite on near")
    client.force_login(staff("view_modulehealth"))
    page = client.get(reverse("admin:cleanup_modulehealth_changelist")).content.decode()
    clocks = re.search(r'<p id="worker-clocks".*?</p>', page, re.S).group(0)
    assert re.search(r'class="health-down clock-off"[^>]*>eventsite on far \+12\.[234] s \(measured \d s ago\)', clocks)
    assert re.search(r"<span>eventsite on near [+-]0\.\d s \(measured \d s ago\)</span>", clocks)


# -- a clock really off, under faketime -------------------------------------------------------

MEASURE = "import django; django.setup(); from cleanup import skew; print(skew.measure().offset_s)"


def database_url():
    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("faketime") is None, reason="needs faketime (apt-get install faketime)")
def test_a_process_whose_clock_is_90_s_ahead_measures_it_and_check_warns():
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    ahead = ["faketime", "-f", "+90s", sys.executable]

    def run(*args):
        return subprocess.run([*ahead, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)

    measured = run("-c", MEASURE)
    assert measured.returncode == 0, measured.stderr
    assert float(measured.stdout.strip().splitlines()[-1]) == pytest.approx(90, abs=5)
    checked = run(str(ROOT / "manage.py"), "check", "--database", "default")
    assert checked.returncode == 0, checked.stderr
    assert "cleanup.W032" in checked.stderr and re.search(
        r"This process's clock is \+(8[5-9]|9[0-5])\.\d s off", checked.stderr
    )
