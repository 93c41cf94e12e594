"""Clean text (issue 20, item 6): names, reasons, actors and every string of a step's params
refuse control characters (C0/C1 but tab) and bidirectional controls, with the field named, in
every write path (API, admin, commands, the engine); and no stored text adds a header or a
line to an alert mail or webhook."""

import json
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.urls import reverse

from cleanup import alerts, manual, outages, registry, runner, validation
from cleanup.models import Alert, ModuleEvent, ModuleHealth, Resource, Run, RunStatus
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step
from tests.test_api_access import api_as

pytestmark = pytest.mark.django_db

API = "/api/events/"
# CR, LF, ESC, DEL, NEL (C1), RLO, LRI, RLM.
BAD = ["\r", "\n", "\x1b", "\x7f", "\x85", "\u202e", "\u2066", "\u200f"]
SPAWN = "test.spawn"


@pytest.fixture
def failed_row():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    run = make_run(status=RunStatus.ABORTED, name="broken raid")
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    Resource.objects.update(state="failed", revert_attempts=3, last_error="503")
    return Resource.objects.get()


def steps_with(value, key="creature"):
    return [{"action": SPAWN, "params": {key: value, "count": 1}}]


def test_the_validator_refuses_controls_and_bidi_but_keeps_tabs_and_plain_unicode():
    for char in BAD:
        assert validation.clean_text_problem(f"raid{char}night"), repr(char)
    assert validation.clean_text_problem("raid\tnight") is None
    assert validation.clean_text_problem("Überfall der Orks, 第二夜 🐺") is None
    assert validation.one_line("a\r\nBcc: x\u202e") == "a\\r\\nBcc: x\\u202e"


@pytest.mark.parametrize("char", BAD)
def test_the_engine_refuses_them_naming_the_field(char, failed_row):
    with pytest.raises(validation.Invalid) as name:
        runner.start_run(f"raid{char}night", steps_with("orc"))
    assert list(name.value.errors) == ["name"]
    with pytest.raises(validation.Invalid) as param:
        runner.start_run("raid", steps_with(f"orc{char}boss"))
    assert list(param.value.errors) == ["steps[0].params.creature"]
    with pytest.raises(validation.Invalid) as key:
        runner.start_run("raid", [{"action": SPAWN, "params": {"nested": [{f"k{char}": 1}]}}])
    assert list(key.value.errors)[0].startswith("steps[0].params.nested[0]")
    with pytest.raises(validation.Invalid) as actor:
        runner.start_run("raid", steps_with("orc"), actor=f"eve{char}x")
    assert list(actor.value.errors) == ["actor"]
    with pytest.raises(validation.Invalid) as reason:
        manual.waive([failed_row], f"gone{char}by hand", "alice")
    assert list(reason.value.errors) == ["reason"]
    with pytest.raises(validation.Invalid) as down:
        outages.mark_down("test", by="alice", reason=f"deploy{char}now")
    assert list(down.value.errors) == ["reason"]
    with pytest.raises(validation.Invalid):
        runner.cancel_run(failed_row.run_id, actor=f"eve{char}x")
    assert Run.objects.count() == 1
    assert Resource.objects.get().state == "failed"
    assert not ModuleHealth.objects.filter(state="down").exists()


def test_a_tab_is_kept(world):
    run = runner.start_run("raid\tnight", steps_with("orc\tboss"))
    assert run.name == "raid\tnight"


@pytest.mark.parametrize("char", BAD)
def test_the_api_answers_400_naming_the_field(char, failed_row):
    client = api_as("add_run", "cleanup_run", "view_resource")
    cases = [
        ("runs/", {"name": f"raid{char}night", "steps": steps_with("orc")}, "name"),
        ("runs/", {"name": "raid", "steps": steps_with(f"orc{char}boss")}, "steps[0].params.creature"),
        (f"resources/{failed_row.pk}/waive/", {"reason": f"gone{char}by hand"}, "reason"),
        ("modules/test/down/", {"reason": f"deploy{char}now"}, "reason"),
        ("modules/test/backends/north/down/", {"reason": f"deploy{char}now"}, "reason"),
    ]
    for path, body, field in cases:
        response = client.post(API + path, body, format="json")
        assert response.status_code == 400, (path, response.content)
        assert field in json.dumps(response.json()), (path, response.json())
    assert Run.objects.count() == 1
    assert Resource.objects.get().state == "failed"
    assert not ModuleHealth.objects.filter(state="down").exists()


@pytest.mark.parametrize("char", ["\r\n", "\x1b", "\u202e"])
def test_the_admin_forms_refuse_them_with_the_reason_named(char, client, failed_row):
    client.force_login(User.objects.create_superuser("root", password="pw-123456789"))
    waive = client.post(
        reverse("admin:cleanup_resource_changelist"),
        {"action": "waive_rows", "_selected_action": [failed_row.pk], "apply": "1", "reason": f"gone{char}by hand"},
    )
    assert waive.status_code == 200 and "The reason may not contain" in waive.content.decode()
    assert Resource.objects.get().state == "failed"

    down = client.post(
        reverse("admin:cleanup_modulehealth_mark_down") + "?module=test&backend=north",
        {"reason": f"deploy{char}now"},
    )
    assert down.status_code == 200 and "The reason may not contain" in down.content.decode()
    assert not ModuleHealth.objects.filter(state="down").exists()


@pytest.mark.parametrize("char", ["\n", "\x85", "\u2066"])
def test_the_commands_refuse_them_naming_the_field(char, failed_row):
    good, bad = json.dumps(steps_with("orc")), json.dumps(steps_with(f"orc{char}boss"))
    cases = [
        (("start_run", "--name", f"raid{char}night", "--steps", good), "name"),
        (("start_run", "--name", "raid", "--steps", bad), "steps[0].params.creature"),
        (("start_run", "--name", "raid", "--steps", good, "--actor", f"eve{char}x"), "actor"),
        (("waive", str(failed_row.run_id), "--reason", f"gone{char}by hand", "--actor", "alice"), "reason"),
        (("waive", str(failed_row.run_id), "--reason", "gone", "--actor", f"alice{char}x"), "actor"),
        (("cancel_run", str(failed_row.run_id), "--actor", f"eve{char}x"), "actor"),
    ]
    for args, field in cases:
        with pytest.raises((CommandError, SystemExit)) as refused:
            call_command(*args, stdout=StringIO(), stderr=StringIO())
        if isinstance(refused.value, CommandError):
            assert field in str(refused.value) or "control" in str(refused.value), (args, refused.value)
    assert Run.objects.count() == 1
    assert Resource.objects.get().state == "failed"


# -- what was stored before the check, or answered by a module, reaches mails as escapes -------


@override_settings(ADMINS=[("Staff", "staff@example.com")])
def test_a_stored_name_and_error_with_crlf_add_no_header_and_no_line_to_the_mail(failed_row):
    Run.objects.update(name="raid\r\nBcc: victim@example.com", cleanup_status="incomplete")
    Resource.objects.update(last_error="refused\r\n\r\nForged: line \u202eevil")
    alerts.notice()  # claims the transition and sends the outbox
    alerts.deliver()
    mails = [m for m in mail.outbox if "gave up" in m.subject]
    assert len(mails) == 1
    message = mails[0]
    assert "\n" not in message.subject and "\r" not in message.subject
    assert "Bcc" not in message.message().keys() and message.bcc == []
    assert not any(line.startswith("Forged") for line in message.body.splitlines())
    assert "\u202e" not in message.body and "\u202e" not in message.subject
    assert "raid\\r\\nBcc: victim@example.com" in message.subject
    # The webhook's message is the same escaped text.
    payload = Alert.objects.filter(channel="mail").first().payload
    assert payload["run"]["name"] == "raid\\r\\nBcc: victim@example.com"
    assert "\n" not in payload["unresolved"][0]["last_error"]


@override_settings(ADMINS=[("Staff", "staff@example.com")])
def test_a_stored_mark_down_reason_forges_no_line_in_the_module_mail():
    ModuleHealth.objects.create(module="test")
    outages.mark_down("test", by="alice", reason="deploy")
    # As stored before the check: the event's reason carries a line and a right-to-left override.
    event = ModuleEvent.objects.get(kind="module.down")
    event.detail = {**event.detail, "error": "deploy\nUnresolved rows of ended runs on test: 0\u202e"}
    event.save()
    alerts.notice_modules()
    alerts.deliver()
    message = next(m for m in mail.outbox if "down" in m.subject)
    lines = message.body.splitlines()
    assert sum(line.startswith("Unresolved rows of ended runs") for line in lines) == 1
    assert "\u202e" not in message.body
