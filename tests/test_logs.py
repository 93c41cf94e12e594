"""LOG_FORMAT=json: one JSON object per line, with the run, module, backend and task it is about."""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cleanup import registry
from cleanup.logs import ContextFilter, JsonFormatter, about, log_context
from cleanup.sweep import sweep
from tests.fakes import FakeAction, make_rows, make_run, make_step

ROOT = Path(__file__).resolve().parent.parent


class Lines(logging.Handler):
    """What the site's console handler would write, kept as lines."""

    def __init__(self):
        super().__init__()
        self.lines = []
        self.addFilter(ContextFilter())
        self.setFormatter(JsonFormatter())

    def emit(self, record):
        self.lines.append(self.format(record))


@pytest.fixture
def json_lines():
    handler = Lines()
    logger = logging.getLogger("cleanup")
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


def test_a_line_is_one_json_object_with_time_level_logger_and_message(json_lines):
    logging.getLogger("cleanup.test").warning("shard %s is %s", "north", "slow")
    entry = json.loads(json_lines[-1])
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "cleanup.test"
    assert entry["message"] == "shard north is slow"
    assert entry["time"].endswith("+00:00") and "T" in entry["time"]
    assert not {"run", "module", "backend", "task"} & set(entry)


def test_the_context_names_what_a_line_is_about_and_extra_wins(json_lines):
    with log_context(task="tick_task", run=7), log_context(module="sandbox", backend="north"):
        logging.getLogger("cleanup.test").info("inside")
        logging.getLogger("cleanup.test").info("named", extra=about(run=9))
    logging.getLogger("cleanup.test").info("outside")
    inside, named, outside = (json.loads(line) for line in json_lines[-3:])
    assert {k: inside[k] for k in ("task", "run", "module", "backend")} == {
        "task": "tick_task",
        "run": 7,
        "module": "sandbox",
        "backend": "north",
    }
    assert named["run"] == 9
    assert "run" not in outside and "task" not in outside


def test_a_traceback_and_a_message_with_newlines_stay_on_one_line(json_lines):
    try:
        raise RuntimeError("shard socket\nclosed")
    except RuntimeError:
        logging.getLogger("cleanup.test").exception("call failed\nbadly")
    assert len(json_lines[-1].splitlines()) == 1
    entry = json.loads(json_lines[-1])
    assert entry["message"] == "call failed\nbadly"
    assert "RuntimeError: shard socket" in entry["exc"]


@pytest.mark.django_db
def test_a_module_call_that_raises_is_logged_with_its_run_module_and_backend(json_lines):
    def boom(**kwargs):
        raise RuntimeError("shard socket closed")

    registry.register_action(FakeAction(revert=boom))
    run = make_run()
    make_rows(make_step(run), ["orc-1"])
    sweep()
    raised = [json.loads(line) for line in json_lines if "raised RuntimeError" in line]
    assert raised, json_lines
    # Logged on the call's own worker thread, with the pass's context carried over.
    assert raised[0]["run"] == run.pk
    assert raised[0]["module"] == "test"
    assert "backend" not in raised[0]  # the module's only backend has no name


def _manage(env_extra, code, command=None):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "eventsite.settings",
        "DEBUG": "1",
    }
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "manage.py", *(command or ["shell", "--no-imports", "-c", code])],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


CODE = (
    "import logging\n"
    "from cleanup.logs import log_context\n"
    "with log_context(task='prune_task'):\n"
    "    logging.getLogger('cleanup.retention').warning('pruned %s runs', 3)\n"
    "logging.getLogger('eventsite.sandbox').error('shard gone')\n"
)


@pytest.mark.slow
def test_the_site_writes_json_lines_on_stderr_with_log_format_json():
    result = _manage({"LOG_FORMAT": "json"}, CODE)
    assert result.returncode == 0, result.stderr
    entries = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    assert [(e["logger"], e["message"]) for e in entries] == [
        ("cleanup.retention", "pruned 3 runs"),
        ("eventsite.sandbox", "shard gone"),
    ]
    assert entries[0]["task"] == "prune_task"
    assert result.stdout == ""


@pytest.mark.slow
def test_plain_text_stays_the_default_and_a_bad_format_is_refused():
    plain = _manage({"LOG_FORMAT": ""}, CODE)
    assert plain.returncode == 0, plain.stderr
    assert "WARNING cleanup.retention pruned 3 runs" in plain.stderr
    # (`shell` carries on without settings it cannot read; `check` says why.)
    bad = _manage({"LOG_FORMAT": "xml"}, CODE, command=["check"])
    assert bad.returncode != 0
    assert "LOG_FORMAT must be plain or json, not 'xml'" in bad.stderr
