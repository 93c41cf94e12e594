"""Guessed passwords: a username is locked out after EVENT_LOGIN_FAILURE_LIMIT failures, even
with the right password, the page says so, failures are listed, and a superuser lifts it."""

import logging
from datetime import timedelta

import pytest
import time_machine
from axes.models import AccessAttempt, AccessFailureLog
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings
from django.utils import timezone

pytestmark = pytest.mark.django_db

LOGIN = "/admin/login/?next=/admin/"
PASSWORD = "pw-123456789"


@pytest.fixture
def staff():
    return User.objects.create_user("operator", password=PASSWORD, is_staff=True)


@pytest.fixture
def root():
    return User.objects.create_superuser("root", password=PASSWORD)


def log_in(client, username, password):
    return client.post(LOGIN, {"username": username, "password": password, "next": "/admin/"})


def signed_in(client):
    return client.get("/admin/").status_code == 200


def test_the_right_password_is_refused_after_five_failures_and_the_page_says_why(staff, caplog):
    client = Client()
    with caplog.at_level(logging.WARNING, logger="axes"):
        for _ in range(5):
            answer = log_in(client, "operator", "wrong")
            assert answer.status_code in (200, 429)
    answer = log_in(client, "operator", PASSWORD)
    assert answer.status_code == 429
    assert int(answer["Retry-After"]) == 900
    text = answer.content.decode()
    assert "locked out after 5 failed logins" in text and "15 minutes" in text
    assert not signed_in(client)
    # Each failure is logged and listed, the lockout too.
    assert AccessFailureLog.objects.filter(username="operator").count() >= 5
    assert AccessFailureLog.objects.filter(username="operator", locked_out=True).exists()
    # The log says so without the username (django-axes masks it: a password typed in
    # the username field would otherwise be logged); the admin's lists name it.
    assert "Locking out" in caplog.text and "login failure" in caplog.text


def test_four_failures_do_not_lock_out_and_a_success_clears_them(staff):
    client = Client()
    for _ in range(4):
        assert log_in(client, "operator", "wrong").status_code == 200
    assert log_in(client, "operator", PASSWORD).status_code == 302
    assert signed_in(client)
    assert not AccessAttempt.objects.filter(username="operator", failures_since_start__gt=0).exists()


def test_the_lockout_is_per_username(staff):
    User.objects.create_user("other", password=PASSWORD, is_staff=True)
    client = Client()
    for _ in range(5):
        log_in(client, "operator", "wrong")
    assert log_in(Client(), "other", PASSWORD).status_code == 302


@override_settings(EVENT_LOGIN_FAILURE_LIMIT=2, EVENT_LOGIN_COOLOFF_S=60)
def test_the_limit_and_cool_off_come_from_the_settings(staff):
    client = Client()
    for _ in range(2):
        log_in(client, "operator", "wrong")
    answer = log_in(client, "operator", PASSWORD)
    assert answer.status_code == 429 and answer["Retry-After"] == "60"
    assert "after 2 failed logins" in answer.content.decode() and "1 minute" in answer.content.decode()


def test_the_lockout_ends_after_the_cool_off(staff):
    client = Client()
    for _ in range(5):
        log_in(client, "operator", "wrong")
    assert log_in(client, "operator", PASSWORD).status_code == 429
    with time_machine.travel(timezone.now() + timedelta(seconds=901), tick=False):
        assert log_in(Client(), "operator", PASSWORD).status_code == 302


def lift_as(client, attempt):
    return client.post(
        "/admin/axes/accessattempt/",
        {"action": "lift", "_selected_action": [attempt.pk], "index": 0},
    )


def test_only_a_superuser_lifts_a_lockout(staff, root):
    for _ in range(5):
        log_in(Client(), "operator", "wrong")
    attempt = AccessAttempt.objects.get(username="operator")

    other = User.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    other.user_permissions.add(*Permission.objects.filter(content_type__app_label="axes"))
    viewer = Client()
    viewer.force_login(other)
    assert viewer.get("/admin/axes/accessattempt/").status_code == 200
    lift_as(viewer, attempt)
    assert viewer.post(f"/admin/axes/accessattempt/{attempt.pk}/delete/", {"post": "yes"}).status_code == 403
    assert AccessAttempt.objects.filter(pk=attempt.pk).exists()
    assert log_in(Client(), "operator", PASSWORD).status_code == 429

    superuser = Client()
    superuser.force_login(root)
    page = superuser.get("/admin/axes/accessattempt/")
    assert page.status_code == 200 and "operator" in page.content.decode()
    answer = lift_as(superuser, attempt)
    assert answer.status_code == 302
    assert not AccessAttempt.objects.filter(pk=attempt.pk).exists()
    assert log_in(Client(), "operator", PASSWORD).status_code == 302
