"""Mail that cannot be used against the site: a bad Host mails nothing, an error mail is
queued for the cluster (never sent inside the request), once per distinct error per
EVENT_ERROR_MAIL_INTERVAL_S."""

import logging.config
from datetime import timedelta
from unittest import mock

import pytest
import time_machine
from django.core import mail
from django.test import Client, override_settings
from django.utils import timezone

from eventsite.settings import LOGGING, logging_config

pytestmark = pytest.mark.django_db

MAILED = dict(
    ADMINS=[("Ops", "ops@example.com")],
    EMAIL_BACKEND="django.core.mail.backends.locmem.EmailBackend",
    ROOT_URLCONF="tests.security.boom_urls",
)


@pytest.fixture
def mail_configured():
    """The site's logging as in production with ADMINS and EMAIL_HOST set; async_task recorded."""
    logging.config.dictConfig(logging_config(mail=True))
    queued = []
    with (
        override_settings(**MAILED),
        mock.patch("django_q.tasks.async_task", side_effect=lambda *a, **k: queued.append((a, k))),
    ):
        yield queued
    logging.config.dictConfig(LOGGING)


def client():
    return Client(raise_request_exception=False)


def run_queued(queued):
    """What the cluster does with the queued tasks: run each by its dotted path."""
    from django.utils.module_loading import import_string

    for args, kwargs in queued:
        import_string(args[0])(*args[1:], **kwargs)


def test_a_bad_host_mails_nothing_and_queues_nothing(mail_configured):
    for _ in range(5):
        assert client().get("/admin/", HTTP_HOST="evil.example").status_code == 400
    assert mail.outbox == [] and mail_configured == []


def test_an_error_mail_is_queued_not_sent_inside_the_request(mail_configured):
    assert client().get("/boom/").status_code == 500
    assert mail.outbox == []  # nothing sent while the request ran
    assert [args[0] for args, _ in mail_configured] == ["django.core.mail.mail_admins"]
    run_queued(mail_configured)
    assert len(mail.outbox) == 1 and "/boom/" in mail.outbox[0].subject
    assert mail.outbox[0].to == ["ops@example.com"]


def test_one_mail_per_distinct_error_per_interval(mail_configured):
    now = timezone.now()
    with time_machine.travel(now, tick=False):
        for _ in range(20):
            client().get("/boom/")
        client().get("/other-boom/")
    assert len(mail_configured) == 2  # one per error, not 21
    with time_machine.travel(now + timedelta(seconds=301), tick=False):
        client().get("/boom/")
    assert len(mail_configured) == 3


def test_a_flood_of_503_from_healthz_mails_once(mail_configured):
    for _ in range(10):
        assert client().get("/healthz").status_code == 503
    assert len(mail_configured) == 1


def test_a_mail_that_cannot_be_queued_does_not_break_the_answer():
    logging.config.dictConfig(logging_config(mail=True))
    try:
        with override_settings(**MAILED), mock.patch("django_q.tasks.async_task", side_effect=OSError("broker down")):
            assert client().get("/boom/").status_code == 500
        assert mail.outbox == []
    finally:
        logging.config.dictConfig(LOGGING)
