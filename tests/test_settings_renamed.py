"""A renamed setting: `EVENT_RUN_BATCH` is now `EVENT_ADVANCE_RUN_BATCH`, and the old name still works.
Imports the engine's settings, its checks and the runner; the site's environment is read in a child process.

The old name is read, as a Django setting and as an environment variable, while the new one
is not set, is checked against the same bounds, and `manage.py check` warns that it is deprecated.
"""

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.test import override_settings

from cleanup.checks import check_engine_settings, check_renamed_settings
from cleanup.conf import setting
from cleanup.models import Run, RunStatus
from cleanup.runner import advance, start_run
from tests.test_runner import spawn


def test_it_reads_the_old_name_while_the_new_one_is_not_set():
    assert setting("EVENT_ADVANCE_RUN_BATCH") == 10
    with override_settings(EVENT_RUN_BATCH=4):
        assert setting("EVENT_ADVANCE_RUN_BATCH") == 4
        assert setting("EVENT_RUN_BATCH") == 4
    with override_settings(EVENT_RUN_BATCH=4, EVENT_ADVANCE_RUN_BATCH=6):
        assert setting("EVENT_ADVANCE_RUN_BATCH") == 6


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["EVENT_ADVANCE_RUN_BATCH", "EVENT_RUN_BATCH"])
def test_the_advance_leg_takes_at_most_the_batch_under_either_name(world, name):
    for i in range(3):
        start_run(f"r{i}", [spawn(1)])
    with override_settings(**{name: 2}):
        advance()
    assert Run.objects.filter(status=RunStatus.COMPLETED).count() == 2


def test_check_warns_that_the_old_name_is_deprecated_and_names_the_new_one():
    assert check_renamed_settings() == []
    with override_settings(EVENT_RUN_BATCH=4):
        (warning,) = check_renamed_settings()
    assert warning.id == "cleanup.W001"
    assert warning.msg == "EVENT_RUN_BATCH is deprecated: it is now EVENT_ADVANCE_RUN_BATCH."
    with override_settings(EVENT_ADVANCE_RUN_BATCH=4):
        assert check_renamed_settings() == []


def test_the_old_name_is_checked_against_the_bounds_of_the_new_one():
    with override_settings(EVENT_RUN_BATCH=0):
        assert [e.msg for e in check_engine_settings()] == ["EVENT_RUN_BATCH=0 is outside 1..10000."]


CHECK_IN_THE_SITE = (
    "import json, django; django.setup(); from django.core.checks import run_checks;"
    "from cleanup.conf import setting;"
    "print(json.dumps({'batch': setting('EVENT_ADVANCE_RUN_BATCH'),"
    " 'checks': [f'{e.id}: {e.msg}' for e in run_checks() if e.id.startswith('cleanup.')]}))"
)


def site_with(tmp_path, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("EVENT_", "DJANGO_SETTINGS"))}
    full.update(DEBUG="1", DJANGO_SETTINGS_MODULE="eventsite.settings", EVENTSITE_VAR_DIR=str(tmp_path), **env)
    result = subprocess.run(
        [sys.executable, "-c", CHECK_IN_THE_SITE],
        cwd=settings.BASE_DIR,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_site_reads_the_old_environment_variable_and_check_warns(tmp_path):
    assert site_with(tmp_path) == {"batch": 10, "checks": []}
    assert site_with(tmp_path, EVENT_RUN_BATCH="3") == {
        "batch": 3,
        "checks": ["cleanup.W001: EVENT_RUN_BATCH is deprecated: it is now EVENT_ADVANCE_RUN_BATCH."],
    }
    assert site_with(tmp_path, EVENT_RUN_BATCH="3", EVENT_ADVANCE_RUN_BATCH="5")["batch"] == 5
    assert site_with(tmp_path, EVENT_ADVANCE_RUN_BATCH="5") == {"batch": 5, "checks": []}
