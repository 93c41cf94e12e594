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
    # State, since when, why and who in one cell, the list's first after the module.
    state = cell(page, "health_shown")
    assert '<strong class="health-down">down for 3 min</strong>' in state
    assert re.search(r'class="health-since">since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC<', state)
    assert '<span class="health-why">why: disk swap</span>' in state
    assert '<span class="health-who">by alice</span>' in state
    link = re.search(r'href="([^"]+)" class="health-log">its log</a>', state)[1].replace("&amp;", "&")
    assert link == reverse("admin:cleanup_moduleevent_changelist") + "?module=test"
    assert "module.down" in staffer.get(link).content.decode()
    assert 'class="health-rows">it holds no unresolved row' in state


def test_a_backend_that_came_back_shows_its_old_error_as_old_with_the_time_it_answered(staffer):
    outages.mark_down("test", by="alice", reason="disk swap")
    outages.mark_up("test", by="alice")
    page = staffer.get(HEALTH).content.decode()
    error = cell(page, "health_shown")
    assert error.startswith('<div class="health-line"><span class="health-up">up</span>')
    answered = r"before it answered again at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC: disk swap"
    assert re.search(r'class="old-error"[^>]*>' + answered, error)


def test_an_up_backend_failing_now_shows_its_error_as_current(staffer):
    outages.record("test", "connection refused")
    error = cell(staffer.get(HEALTH).content.decode(), "health_shown")
    assert "old-error" not in error and "connection refused</span> <small>(at " in error


def test_the_list_stays_current_through_its_live_rows_behind_its_permission(staffer, client):
    page = staffer.get(HEALTH).content.decode()
    live = reverse("admin:cleanup_modulehealth_live")
    assert f'data-live-src="{live}"' in page and "cleanup/live.js" in page
    outages.mark_down("test", by="alice", reason="disk swap")
    rows = staffer.get(live + "?state__exact=down").content.decode()
    assert 'data-live-rows="#result_list"' in rows
    assert "why: disk swap" in cell(rows, "health_shown") and "by alice" in cell(rows, "health_shown")
    staffer.logout()
    clerk = User.objects.create_user("clerk", password="pw-123456789", is_staff=True)
    client.force_login(clerk)
    assert client.get(live).status_code == 403
