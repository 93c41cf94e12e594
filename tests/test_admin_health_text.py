"""Module health as a person on shift reads it: coloured, how long down, its log a click away, old errors dated."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from cleanup import outages, registry
from cleanup.models import ModuleHealth
from tests.fakes import FakeAction

pytestmark = pytest.mark.django_db

HEALTH = reverse("admin:cleanup_modulehealth_changelist")


@pytest.fixture
def staffer(client):
    registry.register_action(FakeAction())
    client.force_login(User.objects.create_superuser("root", password="pw-123456789"))
    return client


def cell(page, name, module="test"):
    """A cell of the module's row (the site's own modules are listed too)."""
    rows = re.findall(r"<tr>(.*?)</tr>", page.split('id="result_list"')[1], re.S)
    row = next(r for r in rows if re.search(rf'class="field-module"><a [^>]*>{module}</a>', r))
    return re.search(rf'<td class="field-{name}">(.*?)</td>', row, re.S)[1]


def test_a_down_backend_says_for_how_long_in_red_with_a_link_to_its_log(staffer):
    outages.mark_down("test", by="alice", reason="disk swap")
    ModuleHealth.objects.filter(module="test").update(down_since=timezone.now() - timedelta(minutes=3, seconds=5))
    page = staffer.get(HEALTH).content.decode()
    state = cell(page, "state_shown")
    assert '<strong class="health-down">down for 3 min</strong>' in state
    link = re.search(r'href="([^"]+)" class="health-log">its log</a>', state)[1].replace("&amp;", "&")
    assert link == reverse("admin:cleanup_moduleevent_changelist") + "?module=test"
    assert "module.down" in staffer.get(link).content.decode()
    assert re.search(r"disk swap</span> <small>\(at \d\d:\d\d:\d\d\)</small>", cell(page, "error"))


def test_a_backend_that_came_back_shows_its_old_error_as_old_with_the_time_it_answered(staffer):
    outages.mark_down("test", by="alice", reason="disk swap")
    outages.mark_up("test", by="alice")
    page = staffer.get(HEALTH).content.decode()
    assert cell(page, "state_shown").startswith('<span class="health-up">up</span>')
    error = cell(page, "error")
    answered = r"before it answered again at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d: disk swap"
    assert re.search(r'class="old-error"[^>]*>' + answered, error)


def test_an_up_backend_failing_now_shows_its_error_as_current(staffer):
    outages.record("test", "connection refused")
    error = cell(staffer.get(HEALTH).content.decode(), "error")
    assert "old-error" not in error and "connection refused</span> <small>(at " in error
