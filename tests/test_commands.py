"""The commands: one summary line each, a clear error and a non-zero exit on bad input."""

import pytest
from django.core.management import CommandError, call_command

from cleanup import registry
from cleanup.models import RunStatus
from tests.databases import scratch_database  # noqa: F401  (the fixture)
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step, states

pytestmark = pytest.mark.django_db


def run_command(*args):
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()


def test_sweep_prints_a_one_line_summary():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    run = make_run()
    make_rows(make_step(run), ["orc-1", "orc-2"])

    line = run_command("sweep")

    assert line == "swept 1 run(s): attempted 3, reverted 3, drifted 0, failed 0, remaining 0"
    assert set(states(run).values()) == {"reverted"}


def test_cleanup_run_with_reset_gives_back_and_logs_the_actor():
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)

    line = run_command("cleanup_run", str(run.pk), "--reset", "--actor", "dana")

    assert line == f"run {run.pk}: attempted 1, reverted 1, drifted 0, failed 0, remaining 0; cleanup complete"
    assert run.log.get(kind="cleanup.retry").detail["by"] == "dana"


def test_cleanup_run_refuses_an_unknown_run():
    with pytest.raises(CommandError, match="there is no run 999"):
        call_command("cleanup_run", "999")


def test_cleanup_run_refuses_a_run_in_flight():
    run = make_run(status=RunStatus.RUNNING)
    with pytest.raises(CommandError, match=f"run {run.pk} is still running"):
        call_command("cleanup_run", str(run.pk))


def test_reconcile_refuses_an_unknown_module():
    with pytest.raises(CommandError, match='no module is named "atlantis"'):
        call_command("reconcile", "--module", "atlantis")


def test_reconcile_of_one_module_prints_its_summary():
    registry.register_action(FakeAction(reconcile=Scripted({"ok": True, "in_force": []})))
    run = make_run()
    make_rows(make_step(run), ["orc-1"])
    line = run_command("reconcile", "--module", "test")
    assert line == "reconciled test: asked 1, in force 0, orphaned 1, unanswered 0, resurrected 0"


@pytest.mark.slow
def test_commands_exit_non_zero_from_the_shell(tmp_path, scratch_database):  # noqa: F811
    import os
    import subprocess
    import sys

    from django.conf import settings

    env = {**os.environ, "DEBUG": "1", "EVENTSITE_VAR_DIR": str(tmp_path), "DATABASE_URL": scratch_database}
    base = [sys.executable, str(settings.BASE_DIR / "manage.py")]
    subprocess.run([*base, "migrate", "-v0"], env=env, check=True, timeout=120)
    result = subprocess.run([*base, "cleanup_run", "42"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "there is no run 42" in result.stderr
    result = subprocess.run([*base, "reconcile", "--module", "x"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert 'no module is named "x"' in result.stderr
