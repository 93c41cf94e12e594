"""Guessed passwords: a username is locked out from an address after EVENT_LOGIN_FAILURE_LIMIT
failures there, even with the right password, but not from elsewhere; an address is locked
out after EVENT_LOGIN_ADDRESS_FAILURE_LIMIT failures whatever the usernames; the page says
so, failures are listed, and a superuser lifts it."""

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


def from_address(address):
    return Client(REMOTE_ADDR=address)


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
    assert "username is locked out from this address after 5 failed logins" in text and "15 minutes" in text
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


def test_the_superuser_logs_in_from_another_address_while_locked_out_from_one(root):
    attacker = from_address("203.0.113.7")
    for _ in range(5):
        log_in(attacker, "root", "wrong")
    assert log_in(from_address("203.0.113.7"), "root", PASSWORD).status_code == 429
    office = from_address("10.1.2.3")
    assert log_in(office, "root", PASSWORD).status_code == 302
    assert signed_in(office)
    # Still refused where the guesses came from.
    assert log_in(from_address("203.0.113.7"), "root", PASSWORD).status_code == 429


def test_one_address_trying_many_usernames_is_refused_past_the_address_limit(staff):
    names = ["operator", "admin", "root", "ops", "deploy", "backup"]
    guesser = from_address("198.51.100.4")
    answers = [log_in(guesser, name, "wrong").status_code for _ in range(4) for name in names]
    # 24 guesses, 4 per username (under the username's limit of 5): the 20th failure locks
    # the address out (answered with the lockout page, as the username's 5th is), and so on.
    assert answers[:19] == [200] * 19
    assert set(answers[19:]) == {429}
    refused = log_in(from_address("198.51.100.4"), "operator", PASSWORD)
    assert refused.status_code == 429
    assert "address is locked out after 20 failed logins" in refused.content.decode()
    # Another address is not held up.
    assert log_in(from_address("10.1.2.3"), "operator", PASSWORD).status_code == 302


@override_settings(EVENT_LOGIN_ADDRESS_FAILURE_LIMIT=3)
def test_the_address_limit_comes_from_the_settings_and_ends_after_the_cool_off(staff):
    guesser = from_address("198.51.100.5")
    for name in ("a", "b", "c"):
        assert log_in(guesser, name, "wrong").status_code in (200, 429)
    assert log_in(from_address("198.51.100.5"), "operator", PASSWORD).status_code == 429
    with time_machine.travel(timezone.now() + timedelta(seconds=901), tick=False):
        assert log_in(from_address("198.51.100.5"), "operator", PASSWORD).status_code == 302


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
