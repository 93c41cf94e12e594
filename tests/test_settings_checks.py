"""Settings: read from the environment, checked, and refused by name when wrong."""

import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.test import override_settings

from cleanup.checks import check_database_is_postgresql, check_engine_settings, check_q_cluster


def errors_for(**overrides):
    with override_settings(**overrides):
        return [e.msg for e in check_engine_settings()]


@pytest.mark.parametrize(
    "name,value",
    [
        ("EVENT_REVERT_MAX_ATTEMPTS", 0),
        ("EVENT_REVERT_MAX_ATTEMPTS", 101),
        ("EVENT_CLEANUP_RUN_BATCH", "10"),
        ("EVENT_CLEANUP_GROUPS_PER_RUN", -1),
        ("EVENT_DEFAULT_BUDGET_MS", True),
        ("EVENT_CLAIM_TIMEOUT_S", 0),
        ("EVENT_REVERT_BACKOFF_S", 1.5),
    ],
)
def test_a_bad_engine_setting_is_named_with_its_value(name, value):
    messages = errors_for(**{name: value})
    assert len(messages) == 1
    assert messages[0].startswith(f"{name}={value!r}")


def test_the_default_settings_pass_the_checks():
    assert check_engine_settings() == []
    assert check_q_cluster() == []


def test_a_claim_shorter_than_a_call_is_refused():
    messages = errors_for(EVENT_CLAIM_TIMEOUT_S=5, EVENT_DEFAULT_BUDGET_MS=10_000)
    assert messages == ["EVENT_CLAIM_TIMEOUT_S=5 is not longer than EVENT_DEFAULT_BUDGET_MS=10000 ms."]


def test_django_q_timeout_must_stay_below_retry_and_failures_must_end():
    conf = dict(settings.Q_CLUSTER)
    assert conf["timeout"] < conf["retry"]
    with override_settings(Q_CLUSTER={**conf, "timeout": 900, "retry": 600}):
        assert [e.id for e in check_q_cluster()] == ["cleanup.E011"]
    with override_settings(EVENT_TICK_BUDGET_S=600):
        assert [e.id for e in check_q_cluster()] == ["cleanup.E014"]
    with override_settings(Q_CLUSTER={**conf, "ack_failures": False, "max_attempts": 0}):
        assert [e.id for e in check_q_cluster()] == ["cleanup.E012", "cleanup.E013"]


def settings_import(env):
    full = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG", "DATABASE_URL")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", "import eventsite.settings as s; print(s.DATABASES['default']['ENGINE'])"],
        cwd=settings.BASE_DIR,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.slow
def test_it_refuses_to_start_without_a_secret_key_when_debug_is_off():
    result = settings_import({"DEBUG": "0"})
    assert result.returncode != 0
    assert "SECRET_KEY is not set" in result.stderr


@pytest.mark.slow
def test_it_names_an_unreadable_environment_variable(tmp_path):
    result = settings_import({"DEBUG": "1", "EVENT_REVERT_MAX_ATTEMPTS": "three"})
    assert "EVENT_REVERT_MAX_ATTEMPTS='three' is not a whole number" in result.stderr
    result = settings_import({"DEBUG": "maybe"})
    assert "DEBUG='maybe' is not a boolean" in result.stderr


@pytest.mark.slow
def test_it_defaults_to_the_local_postgresql_and_reads_database_url():
    result = settings_import({"DEBUG": "1", "EVENTSITE_VAR_DIR": "/nonexistent"})
    assert result.stdout.strip() == "django.db.backends.postgresql"
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "import eventsite.settings as s; d = s.DATABASES['default'];"
            "print(d['HOST'], d['PORT'], d['USER'], d['NAME'])",
        ],  # fmt: skip
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DEBUG": "1", "DATABASE_URL": ""},
    )
    assert where.stdout.split() == ["127.0.0.1", "5432", "postgres", "eventsite"]
    result = settings_import({"DEBUG": "1", "DATABASE_URL": "postgres://u@db.example:6543/db"})
    assert result.stdout.strip() == "django.db.backends.postgresql"
    result = settings_import({"DEBUG": "1", "DATABASE_URL": "nosuchdb://x"})
    assert "DATABASE_URL cannot be read" in result.stderr


def test_the_site_database_passes_the_postgresql_check():
    assert check_database_is_postgresql() == []


@pytest.mark.parametrize(
    "database",
    [
        {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
        {"ENGINE": "django.db.backends.mysql", "NAME": "eventsite"},
    ],
)
@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_another_database_engine_is_refused_with_how_to_point_at_postgresql(database):
    with override_settings(DATABASES={**settings.DATABASES, "other": database}):
        errors = check_database_is_postgresql()
    assert [e.id for e in errors] == ["cleanup.E020"]
    assert "'other'" in errors[0].msg and "runs on PostgreSQL only" in errors[0].msg
    assert "DATABASE_URL" in errors[0].hint


@pytest.mark.slow
def test_manage_py_check_refuses_a_sqlite_database_url(tmp_path):
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=settings.BASE_DIR,
        env={**os.environ, "DEBUG": "1", "DATABASE_URL": f"sqlite:///{tmp_path}/eventsite.sqlite3"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "cleanup.E020" in result.stderr and "runs on PostgreSQL only" in result.stderr
