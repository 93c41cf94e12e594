"""A command given bad input, or run without a setting it needs, prints one line and exits non-zero."""

import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from cleanup import registry
from cleanup.management.base import EventCommand
from cleanup.models import Run
from tests.fakes import FakeAction

MANAGE = [sys.executable, str(settings.BASE_DIR / "manage.py")]


@pytest.fixture(scope="module")
def shell(tmp_path_factory):
    """Runs manage.py in a fresh process with an empty var/; answers (code, stderr).

    Every input here is refused before the database is used.
    """
    var = tmp_path_factory.mktemp("var")
    env = {**os.environ, "DEBUG": "1", "EVENTSITE_VAR_DIR": str(var), "DJANGO_SETTINGS_MODULE": "eventsite.settings"}

    def run(*args, **extra_env):
        merged = {**env, **extra_env}
        for name, value in extra_env.items():
            if value is None:
                merged.pop(name)
        result = subprocess.run([*MANAGE, *args], env=merged, capture_output=True, text=True, timeout=60)
        return result.returncode, result.stderr.strip()

    return run


def assert_one_line(code, stderr):
    assert code != 0
    assert "Traceback" not in stderr, stderr
    assert len(stderr.splitlines()) == 1, stderr
    return stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", [["tick"], ["qcluster"]])
def test_it_reports_a_missing_secret_key_in_one_line(shell, command):
    stderr = assert_one_line(*shell(*command, DEBUG="0", SECRET_KEY=None))
    assert "SECRET_KEY is not set" in stderr


@pytest.mark.slow
def test_it_reports_an_unreadable_database_url_in_one_line(shell):
    stderr = assert_one_line(*shell("tick", DATABASE_URL="nosuch://x"))
    assert "DATABASE_URL" in stderr


@pytest.mark.slow
def test_it_refuses_a_huge_integer_from_the_shell_in_one_line(shell):
    code, stderr = shell("start_run", "--name", "raid", "--steps", "[" + "9" * 5000 + "]")
    assert code == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith("CommandError: the run was not started: --steps: is not valid JSON"), stderr


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args, words",
    [
        (["start_run", "--name", "raid", "--steps", "[" * 100_000], "--steps: nests deeper than 32 levels"),
        (
            ["start_run", "--name", "raid", "--steps", '[{"action": "core.wait", "params": {"seconds": 1e400}}]'],
            "--steps[0].params.seconds: must be a finite number",
        ),
        (
            ["start_run", "--name", "raid", "--steps", '[{"action": "core.wait", "params": {"x": "\\ud800"}}]'],
            "--steps[0].params.x: is not valid Unicode (a lone surrogate)",
        ),
        (
            ["start_run", "--name", "raid", "--steps", '[{"action": "core.wait", "params": {"x": "\\u0000"}}]'],
            "--steps[0].params.x: may not contain a NUL character",
        ),
        (["start_run", "--name", "raid", "--actor", "a\x00", "--steps", "[]"], "may not contain a NUL character"),
        (["cleanup_run", "99999999999999999999999"], "an id is a whole number"),
        (["cancel_run", "-3"], "an id is a whole number"),
        (["cancel_run", "abc"], "an id is a whole number"),
        (["reconcile", "--module", "x\x00"], "may not contain a NUL character"),
    ],
)
def test_it_refuses_bad_input_with_a_command_error(args, words):
    registry.register_action(FakeAction())
    with pytest.raises(CommandError) as refused:
        call_command(*args)
    assert words in str(refused.value)
    assert "\n" not in str(refused.value)
    assert not Run.objects.exists()


def test_an_unexpected_error_from_the_shell_is_one_line_unless_traceback_is_asked(capsys):
    class Broken(EventCommand):
        def handle(self, *args, **options):
            raise RuntimeError("the shard\nwent away")

    with pytest.raises(SystemExit) as exited:
        Broken().run_from_argv(["manage.py", "broken"])
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err == "RuntimeError: the shard went away (--traceback shows where)"
    with pytest.raises(RuntimeError):
        Broken().run_from_argv(["manage.py", "broken", "--traceback"])


@pytest.mark.django_db
def test_a_command_built_on_the_helper_turns_a_value_the_database_refuses_into_one_line():
    from tests.fakes import make_rows, make_run, make_step

    run = make_run()
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    with pytest.raises(CommandError, match="NUL"):
        call_command("waive", str(run.pk), "--reason", "gone\x00", "--actor", "dana")
    assert not run.log.filter(kind="resource.waived").exists()
