"""`manage.py check_module`: one line per check, a non-zero exit on any failure, and a
module from outside the site installed by `EVENT_MODULES` alone."""

import json
import os
import subprocess
import sys
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from tests.shard import shard_fleet, shard_process  # noqa: F401  (pytest fixtures)

PARAMS = json.dumps({"creature": "orc", "count": 2, "at": "north-gate"})


def manage(*args, tmp_path, shard_url="http://127.0.0.1:9", modules=None):
    env = {**os.environ, "DEBUG": "1", "EVENTSITE_VAR_DIR": str(tmp_path), "SANDBOX_SHARD_URL": shard_url}
    env.pop("DATABASE_URL", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("EVENT_MODULES", None)
    if modules is not None:
        env["EVENT_MODULES"] = modules
    return subprocess.run(
        [sys.executable, str(settings.BASE_DIR / "manage.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_checks_a_module_installed_by_event_modules_and_exits_zero(shard_process, tmp_path):  # noqa: F811
    result = manage(
        "check_module",
        "kit.spawn",
        "--params",
        PARAMS,
        tmp_path=tmp_path,
        shard_url=shard_process.url,
        modules="tests.kit_modules",
    )

    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert all(line.startswith(("ok   ", "skip ")) for line in lines[:-1])
    assert "ok   with the backend down, reconcile answers a failure, never a list" in lines
    assert lines[-1] == f"action kit.spawn: all {len(lines) - 1} checks passed"
    assert [c for c in shard_process.get("/creatures").json()["creatures"] if c["key"]] == []


def test_it_prints_what_failed_and_exits_non_zero(shard_process, tmp_path):  # noqa: F811
    result = manage(
        "check_module",
        "kit.lying_revert",
        "--params",
        PARAMS,
        tmp_path=tmp_path,
        shard_url=shard_process.url,
        modules="tests.kit_modules",
    )

    assert result.returncode == 1
    fail = [line for line in result.stdout.splitlines() if line.startswith("FAIL ")]
    assert (
        'FAIL reconcile after a revert reports nothing in force: expected {"ok": True, "in_force": []}; '
        "got still in force: [" in "\n".join(fail)
    )
    # 31 checks: the kit also checks backend_of, health() (up, its boot id, down) and the
    # shape of `failed`, and says it skipped the refusal (the command cannot make one).
    assert result.stderr.strip().splitlines()[-1].endswith("action kit.lying_revert: 5 of 36 checks failed")


@pytest.mark.slow
def test_a_module_not_in_event_modules_is_not_installed(tmp_path):
    result = manage("check_module", "kit.spawn", tmp_path=tmp_path)
    assert result.returncode == 1
    assert "no module registers an action or a lease 'kit.spawn'" in result.stderr


@pytest.mark.slow
def test_event_modules_refuses_a_path_that_cannot_be_an_app(tmp_path):
    result = manage("check", tmp_path=tmp_path, modules="tests.kit_modules,my-game/module")
    assert result.returncode != 0
    assert "EVENT_MODULES: 'my-game/module' is not a dotted Python path of an app" in result.stderr


def test_it_checks_a_lease_in_process(shard_process):  # noqa: F811
    out = StringIO()
    with override_settings(SANDBOX_SHARD_URL=shard_process.url):
        call_command("check_module", "sandbox.spawner_rate", "--target", "orc-camp", "--value", "5", stdout=out)
    lines = out.getvalue().strip().splitlines()
    assert "ok   restore when the baseline is already in place succeeds" in lines
    assert lines[-1].startswith("lease sandbox.spawner_rate on 'orc-camp': all ")


def test_it_checks_one_backend_of_a_fleet(shard_fleet):  # noqa: F811
    out = StringIO()
    params = json.dumps({"creature": "orc", "count": 2, "at": "north-gate", "shard": "south"})
    with shard_fleet.settings():
        call_command("check_module", "sandbox.spawn", "--params", params, "--backend", "south", stdout=out)
        call_command(
            "check_module",
            "sandbox.spawner_rate",
            "--target",
            "south:orc-camp",
            "--value",
            "5",
            "--backend",
            "south",
            stdout=out,
        )
    lines = out.getvalue().strip().splitlines()
    assert "ok   health answers the backend's boot id, the same while it runs" in lines
    assert "ok   with the backend down, health answers a failure with unavailable: true" in lines
    assert any(line.startswith("action sandbox.spawn on backend 'south': all ") for line in lines)
    assert lines[-1].startswith("lease sandbox.spawner_rate on 'south:orc-camp' on backend 'south': all ")
    assert "POST /spawn" not in shard_fleet["north"].stderr()


def test_it_names_a_backend_the_params_do_not_name(shard_fleet):  # noqa: F811
    params = json.dumps({"creature": "orc", "count": 2, "at": "north-gate", "shard": "north"})
    with shard_fleet.settings(), pytest.raises(CommandError, match="action sandbox.spawn on backend 'south': "):
        call_command("check_module", "sandbox.spawn", "--params", params, "--backend", "south", stdout=StringIO())


@pytest.mark.parametrize(
    "args, message",
    [
        (["sandbox.spawn", "--params", "{count: 2}"], "--params is not JSON"),
        (["sandbox.spawn", "--params", "[1]"], "--params must be a JSON object"),
        (["sandbox.spawner_rate", "--value", "5"], "sandbox.spawner_rate is a lease: give --target and --value"),
        (["atlantis.sink"], "no module registers an action or a lease 'atlantis.sink'"),
        (["sandbox.spawn", "--backend", "north/1"], "--backend 'north/1': a backend's name is text"),
    ],
)
def test_it_refuses_bad_input_naming_it(args, message):
    with pytest.raises(CommandError, match=message.replace("[", r"\[").replace("{", r"\{")):
        call_command("check_module", *args)
