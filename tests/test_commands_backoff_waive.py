"""`cleanup_run` says what waits and `--now` skips the backoff; `waive` resolves rows by hand."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from cleanup import registry
from cleanup.models import Resource
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db

DOWN = {"ok": False, "error": "the shard is down", "retry": True}


def run_command(*args):
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip().splitlines()


def test_cleanup_run_says_when_rows_wait_for_their_backoff_and_now_skips_it():
    revert = Scripted(DOWN)
    registry.register_action(FakeAction(revert=revert))
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    run_command("cleanup_run", str(run.pk))

    waited = run_command("cleanup_run", str(run.pk))
    assert waited[0].startswith(f"run {run.pk}: attempted 0,")
    assert waited[1].startswith("1 row(s) wait for their backoff, the first until 20")
    assert waited[1].endswith("--now tries them now")

    hurried = run_command("cleanup_run", str(run.pk), "--now")
    assert hurried[0].startswith(f"run {run.pk}: attempted 1,")
    assert len(revert.calls) == 2
    assert Resource.objects.get(ref="orc-1").revert_attempts == 2, "--now keeps the attempt counter"


def test_cleanup_run_says_when_rows_wait_for_a_person():
    registry.register_action(FakeAction(revert=Scripted({**DOWN, "retry": False})))
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)

    lines = run_command("cleanup_run", str(run.pk), "--now")

    assert lines[1] == "1 row(s) wait for a person (no attempt left, or refused for good); --reset tries them again"


def test_cleanup_run_without_waiting_rows_prints_one_line():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    assert len(run_command("cleanup_run", str(run.pk), "--now")) == 1


def test_waive_resolves_every_unresolved_row_of_a_run_and_logs_the_actor():
    run = make_run()
    rows = make_rows(make_step(run), ["orc-1", "orc-2"], placeholder=False)
    Resource.objects.filter(pk=rows[1].pk).update(state="reverted")

    lines = run_command("waive", str(run.pk), "--reason", "the shard was wiped", "--actor", "dana")

    assert lines == ["waived 1 of 1 row(s)"]
    assert states(run) == {"orc-1": "waived", "orc-2": "reverted"}
    entry = run.log.get(kind="resource.waived")
    assert (entry.detail["by"], entry.detail["reason"]) == ("dana", "the shard was wiped")
    run.refresh_from_db()
    assert run.cleanup_status == "complete"


def test_waive_of_one_row_leaves_the_others():
    run = make_run()
    rows = make_rows(make_step(run), ["orc-1", "orc-2"], placeholder=False)
    assert run_command("waive", "--row", str(rows[0].pk), "--reason", "gone", "--actor", "dana") == [
        "waived 1 of 1 row(s)"
    ]
    assert states(run) == {"orc-1": "waived", "orc-2": "live"}
    lines = run_command("waive", "--row", str(rows[0].pk), "--reason", "gone", "--actor", "dana")
    assert lines == ["waived 0 of 1 row(s); the others are resolved already or held by a sweeper now"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--reason", "r", "--actor", "a"], "give either a RUN_ID or --row ID"),
        (["7", "--row", "1", "--reason", "r", "--actor", "a"], "give either a RUN_ID or --row ID"),
        (["999", "--reason", "r", "--actor", "a"], "there is no run 999"),
        (["--row", "999", "--reason", "r", "--actor", "a"], "there is no ledger row 999"),
        (["--row", str(2**63), "--reason", "r", "--actor", "a"], "a ledger row id is a whole number"),
        (["999", "--reason", " ", "--actor", "a"], "--reason must say why"),
    ],
)
def test_waive_refuses_bad_input_naming_it(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("waive", *args)
