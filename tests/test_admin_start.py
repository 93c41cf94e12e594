"""Runs started, run again and ended from the admin: each confirmed, each behind its
permission, each through the engine's own entry point and recorded with who did it."""

import json
import re

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from cleanup import registry
from cleanup.models import Resource, Run, RunStatus, Step
from tests.fakes import FakeAction, FakeLease, Scripted, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db

ADD = reverse("admin:cleanup_run_add")


class CountedSpawn(FakeAction):
    """``test.spawn``: ``{"creature": "orc", "count": 5}``: spawns what it is asked for."""

    def __init__(self):
        super().__init__(revert=Scripted({"ok": True, "failed": []}))

    def validate(self, params):
        if not isinstance(params.get("count"), int) or params["count"] < 1:
            raise ValueError(f"count must be a whole number from 1, got {params.get('count')!r}")


@pytest.fixture(autouse=True)
def spawn():
    registry.register_action(CountedSpawn())


def staff(*perms, name="staffer"):
    user = User.objects.create_user(name, password="pw-123456789", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="cleanup"))
    return user


def form(name, *steps, **extra):
    data = {"name": name, "lines": str(len(steps)), **extra}
    for i, (action, params) in enumerate(steps):
        data[f"step-{i}-action"] = action
        data[f"step-{i}-params"] = params if isinstance(params, str) else json.dumps(params)
    return data


def line(content, index):
    """The HTML of one step line of the start form."""
    found = re.search(rf'<tr class="step-line[^"]*" id="step-line-{index}">(.*?)</tr>', content, re.S)
    assert found, f"no step line {index}"
    return found[1]


def test_the_start_form_lists_the_installed_actions_with_their_params_and_needs_add_run(client):
    client.force_login(staff("view_run"))
    assert client.get(ADD).status_code == 403
    assert client.post(ADD, form("raid", ("core.wait", {"seconds": 1}), start="1")).status_code == 403
    assert not Run.objects.exists()
    assert b"start-a-run" not in client.get(reverse("admin:cleanup_run_changelist")).content

    client.force_login(staff("view_run", "add_run", name="starter"))
    assert b"Start a run" in client.get(reverse("admin:cleanup_run_changelist")).content
    page = client.get(ADD).content.decode()
    installed = page[page.index('id="installed-actions"') :]
    assert "<code>test.spawn</code>" in installed and "<code>core.wait</code>" in installed
    assert "<code>{&quot;creature&quot;: &quot;orc&quot;, &quot;count&quot;: 5}</code>" in installed, "no params listed"
    assert "<code>{&quot;seconds&quot;: n}</code>" in installed


def test_the_engines_messages_stand_beside_each_step_and_nothing_starts(client):
    client.force_login(staff("view_run", "add_run"))
    steps = [("test.spawn", {"count": 0}), ("core.wait", "{not json"), ("", ""), ("nope.act", {})]
    page = client.post(ADD, form("raid", *steps, review="1")).content.decode()

    # The same validator as the API's start: the same fields, the same words.
    api = client.post(
        "/api/v1/events/runs/",
        {"name": "raid", "steps": [{"action": "test.spawn", "params": {"count": 0}}]},
        content_type="application/json",
    )
    assert api.status_code == 400
    api_message = api.json()["errors"]["steps[0].params"][0]
    assert f"steps[0].params: {api_message}" in line(page, 0)
    assert "steps[1].params: is not valid JSON" in line(page, 1)
    assert line(page, 2).count("<li>") == 0, "a blank line is not a step"
    # The blank line is left out: the fourth line is the run's third step.
    assert "steps[2].action: no module registers the action &#x27;nope.act&#x27;" in line(page, 3)
    assert 'value="raid"' in page and "{not json" in page, "what was typed is lost"
    assert not Run.objects.exists()

    unnamed = client.post(ADD, form("  ", ("core.wait", {"seconds": 1}), review="1")).content.decode()
    assert "name: a run needs a non-empty name" in unnamed
    none = client.post(ADD, form("raid", ("", ""), review="1")).content.decode()
    assert "steps: a run needs a non-empty list of steps" in none


def test_a_run_is_confirmed_then_started_by_the_engine_and_recorded_with_who_started_it(
    client, django_capture_on_commit_callbacks
):
    client.force_login(staff("view_run", "add_run"))
    steps = form("Orc raid", ("test.spawn", {"creature": "orc", "count": 5}), ("core.wait", {"seconds": 60}))
    confirm = client.post(ADD, {**steps, "review": "1"})
    content = confirm.content.decode()
    assert confirm.status_code == 200 and 'id="confirm-start"' in content
    assert "Orc raid" in content and "test.spawn" in content and "&quot;count&quot;: 5" in content
    assert not Run.objects.exists(), "started before it was confirmed"

    with django_capture_on_commit_callbacks(execute=True):
        started = client.post(ADD, {**steps, "start": "1"})
    run = Run.objects.get()
    assert started.status_code == 302 and started["Location"] == reverse("admin:cleanup_run_change", args=[run.pk])
    assert run.name == "Orc raid" and run.status == RunStatus.RUNNING
    assert [(s.action_id, s.params) for s in run.steps.order_by("position")] == [
        ("test.spawn", {"creature": "orc", "count": 5}),
        ("core.wait", {"seconds": 60}),
    ]
    assert run.log.get(kind="run.started").detail["by"] == "staffer"
    # The tick queued by the start performed the first step and holds at the wait.
    assert run.steps.get(position=0).status == "done"
    entry = LogEntry.objects.get(object_id=str(run.pk))
    assert (entry.user.username, entry.action_flag, entry.change_message) == (
        "staffer",
        ADDITION,
        "Started with 2 step(s)",
    )


def test_change_it_goes_back_to_the_form_with_everything_typed(client):
    client.force_login(staff("view_run", "add_run"))
    back = client.post(ADD, {**form("Orc raid", ("core.wait", {"seconds": 5})), "edit": "1"}).content.decode()
    assert 'id="start-form"' in back and 'value="Orc raid"' in back
    assert '<option value="core.wait" selected>' in line(back, 0)
    more = client.post(ADD, {**form("Orc raid", ("core.wait", {"seconds": 5})), "more": "1"}).content.decode()
    assert 'id="step-line-5"' in more and '<option value="core.wait" selected>' in line(more, 0)
    assert not Run.objects.exists()


def test_run_again_copies_the_steps_to_edit_and_starts_a_new_run(client, django_capture_on_commit_callbacks):
    old = make_run(status=RunStatus.COMPLETED, name="Wolf hunt")
    make_step(old, params={"creature": "wolf", "count": 6})
    make_step(old, action_id="core.wait", params={"seconds": 30})
    again = reverse("admin:cleanup_run_again", args=[old.pk])

    client.force_login(staff("view_run"))
    assert client.get(again).status_code == 403
    assert b"run-again" not in client.get(reverse("admin:cleanup_run_change", args=[old.pk])).content

    client.force_login(staff("view_run", "add_run", name="starter"))
    assert b'id="run-again"' in client.get(reverse("admin:cleanup_run_change", args=[old.pk])).content
    page = client.get(again).content.decode()
    assert 'value="Wolf hunt"' in page and f'name="again" value="{old.pk}"' in page
    assert '<option value="test.spawn" selected>' in line(page, 0)
    assert "&quot;creature&quot;: &quot;wolf&quot;" in line(page, 0) and "&quot;count&quot;: 6" in line(page, 0)
    assert '<option value="core.wait" selected>' in line(page, 1)

    edited = form("Wolf hunt, again", ("test.spawn", {"creature": "wolf", "count": 3}), again=str(old.pk))
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(ADD, {**edited, "start": "1"})
    new = Run.objects.exclude(pk=old.pk).get()
    assert response["Location"] == reverse("admin:cleanup_run_change", args=[new.pk])
    assert [(s.action_id, s.params) for s in new.steps.all()] == [("test.spawn", {"creature": "wolf", "count": 3})]
    assert old.steps.count() == 2, "the old run changed"
    entry = LogEntry.objects.get(object_id=str(new.pk))
    assert entry.change_message == f"Started with 1 step(s), run again from #{old.pk}"
    assert new.log.get(kind="run.started").detail["by"] == "starter"


@pytest.fixture
def holding_run():
    """A running run holding two orcs and a spawner's rate, with a step still to come."""
    lease = FakeLease(values={"north:camp": 5.0})
    registry.register_lease(lease)
    run = make_run(status=RunStatus.RUNNING, name="Orc night")
    make_rows(make_step(run), ["orc-1", "orc-2"], placeholder=False)
    lease_step = make_step(run, action_id="core.lease")
    Resource.objects.create(
        run=run,
        step=lease_step,
        module="test",
        kind="override",
        ref="test.rate#north:camp",
        payload={"baseline": 1.0, "applied": 5.0},
        state="live",
    )
    make_step(run, action_id="core.wait", status="pending", params={"seconds": 600})
    return run


def test_end_now_shows_a_long_ref_whole_not_cut_at_forty_characters(client, holding_run):
    long_ref = "world-north:mobs_animal:wolf:5f0c9a2e-8d1b-4c55-9e7a-000000000007"
    Resource.objects.filter(run=holding_run, ref="orc-2").update(ref=long_ref)
    client.force_login(staff("view_run", "change_run", name="ender"))
    page = client.get(reverse("admin:cleanup_run_end", args=[holding_run.pk])).content.decode()
    assert f'data-copy="{long_ref}"' in page and f'title="{long_ref}"' in page
    assert "world-north:mobs_animal:wolf:5f0c…" not in page


def test_end_now_lists_what_will_be_given_back_and_needs_change_run(client, holding_run):
    end = reverse("admin:cleanup_run_end", args=[holding_run.pk])
    client.force_login(staff("view_run", "add_run"))
    assert client.get(end).status_code == 403
    assert client.post(end, {"apply": "1"}).status_code == 403
    assert b'id="end-now"' not in client.get(reverse("admin:cleanup_run_change", args=[holding_run.pk])).content
    holding_run.refresh_from_db()
    assert holding_run.status == RunStatus.RUNNING

    client.force_login(staff("view_run", "change_run", name="ender"))
    assert b'id="end-now"' in client.get(reverse("admin:cleanup_run_change", args=[holding_run.pk])).content
    page = client.get(end).content.decode()
    assert "It holds 3 row(s)" in page
    # Each ref whole, with its copy button.
    assert 'data-copy="orc-1"' in page and 'data-copy="orc-2"' in page and "test.spawn.revert" in page
    assert "back to 1.0 (now 5.0)" in page, "the lease's restore is not listed"
    assert "1 step(s) not yet finished will not be performed" in page
    assert 'id="confirm-end"' in page
    holding_run.refresh_from_db()
    assert holding_run.status == RunStatus.RUNNING, "ended before it was confirmed"


def test_end_now_giving_back_cancels_through_the_engine_and_lands_on_the_run(
    client, holding_run, django_capture_on_commit_callbacks
):
    client.force_login(staff("view_run", "change_run"))
    end = reverse("admin:cleanup_run_end", args=[holding_run.pk])
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(end, {"apply": "1", "cleanup": "give"})
    assert response["Location"] == reverse("admin:cleanup_run_change", args=[holding_run.pk])
    holding_run.refresh_from_db()
    assert (holding_run.status, holding_run.auto_cleanup) == ("cancelled", True)
    assert states(holding_run) == {"orc-1": "reverted", "orc-2": "reverted", "test.rate#north:camp": "reverted"}
    cancelled = holding_run.log.get(kind="run.cancelled").detail
    assert (cancelled["by"], cancelled["cleanup"]) == ("staffer", True)
    entry = LogEntry.objects.get(object_id=str(holding_run.pk))
    assert (entry.action_flag, entry.change_message) == (CHANGE, "Ended now, giving back what it took")

    # Ended: a second confirmation changes nothing and says so.
    again = client.post(end, {"apply": "1"}, follow=True)
    assert any("already cancelled" in str(m) for m in again.context["messages"])
    assert "there is nothing to end" in client.get(end).content.decode()


def test_end_now_leaving_for_later_keeps_the_rows_for_a_person(client, holding_run):
    client.force_login(staff("view_run", "change_run"))
    client.post(reverse("admin:cleanup_run_end", args=[holding_run.pk]), {"apply": "1", "cleanup": "leave"})
    holding_run.refresh_from_db()
    assert (holding_run.status, holding_run.auto_cleanup) == ("cancelled", False)
    assert set(states(holding_run).values()) == {"live"}
    assert LogEntry.objects.get().change_message == "Ended now, leaving what it took for later"


def test_the_cancel_action_lists_what_will_be_given_back_and_lands_on_the_run(
    client, holding_run, django_capture_on_commit_callbacks
):
    client.force_login(staff("view_run", "change_run"))
    url = reverse("admin:cleanup_run_changelist")
    selected = {"action": "cancel_with_cleanup", "_selected_action": [holding_run.pk]}
    asked = client.post(url, selected).content.decode()
    assert "It holds 3 row(s); these are given back" in asked and 'data-copy="orc-1"' in asked
    assert "back to 1.0 (now 5.0)" in asked
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url, {**selected, "apply": "1"})
    assert response["Location"] == reverse("admin:cleanup_run_change", args=[holding_run.pk])


def test_a_start_whose_action_was_uninstalled_meanwhile_is_refused_beside_its_step(client):
    client.force_login(staff("view_run", "add_run"))
    steps = form("raid", ("test.spawn", {"count": 2}))
    assert b"confirm-start" in client.post(ADD, {**steps, "review": "1"}).content
    registry.unregister_module("test")
    page = client.post(ADD, {**steps, "start": "1"}).content.decode()
    assert "no module registers the action &#x27;test.spawn&#x27;" in line(page, 0)
    assert "test.spawn (not installed)" in line(page, 0)
    assert not Run.objects.exists() and not Step.objects.exists()
