"""Scale-out settings: django-q2 on Redis when REDIS_URL is set, on the ORM broker otherwise."""

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings

from tests.databases import scratch_database  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow  # each test imports the settings in a fresh process

BROKER_OF = (
    "import json, django; django.setup(); from django.conf import settings as s;"
    "from django_q.brokers import get_broker; b = get_broker();"
    "print(json.dumps({'broker': type(b).__name__, 'orm': s.Q_CLUSTER.get('orm'), 'redis': s.Q_CLUSTER.get('redis'),"
    " 'name': s.Q_CLUSTER['name']}))"
)


def broker_for(env, var_dir):
    full = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "Q_NAME", "DATABASE_URL")}
    full.update(DEBUG="1", DJANGO_SETTINGS_MODULE="eventsite.settings", EVENTSITE_VAR_DIR=str(var_dir), **env)
    result = subprocess.run(
        [sys.executable, "-c", BROKER_OF], cwd=settings.BASE_DIR, env=full, capture_output=True, text=True, timeout=60
    )
    return result


def test_it_queues_on_the_orm_broker_without_redis_url(tmp_path, scratch_database):  # noqa: F811
    result = broker_for({"DATABASE_URL": scratch_database}, tmp_path)  # the ORM broker connects
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"broker": "ORM", "orm": "default", "redis": None, "name": "eventsite"}


def test_it_queues_on_redis_when_redis_url_is_set(tmp_path):
    result = broker_for({"REDIS_URL": "redis://127.0.0.1:6379/5", "Q_NAME": "eventsite-eu"}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "broker": "Redis",
        "orm": None,
        "redis": "redis://127.0.0.1:6379/5",
        "name": "eventsite-eu",
    }


def test_it_refuses_a_redis_url_it_cannot_read(tmp_path):
    result = broker_for({"REDIS_URL": "127.0.0.1:6379"}, tmp_path)
    assert result.returncode != 0
    assert "REDIS_URL='127.0.0.1:6379' is not a redis://, rediss:// or unix:// URL" in result.stderr


POLL_OF = "import django; django.setup(); from django_q.conf import Conf; print(Conf.POLL)"


def poll_for(env, var_dir):
    full = {k: v for k, v in os.environ.items() if k not in ("Q_POLL", "DATABASE_URL")}
    full.update(DEBUG="1", DJANGO_SETTINGS_MODULE="eventsite.settings", EVENTSITE_VAR_DIR=str(var_dir), **env)
    return subprocess.run(
        [sys.executable, "-c", POLL_OF], cwd=settings.BASE_DIR, env=full, capture_output=True, text=True, timeout=60
    )


def test_the_orm_broker_looks_for_work_every_tenth_of_a_second_by_default(tmp_path):
    result = poll_for({}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) == 0.1


def test_it_reads_the_orm_brokers_poll_interval_from_q_poll(tmp_path):
    result = poll_for({"Q_POLL": "0.5"}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) == 0.5


def test_it_refuses_a_poll_interval_that_is_not_a_number_or_out_of_range(tmp_path):
    for raw, said in (
        ("fast", "Q_POLL='fast' is not a number"),
        ("0", "Q_POLL='0' is not a number from 0.01 to 60"),
        ("nan", "Q_POLL='nan' is not a number from 0.01 to 60"),
    ):
        result = poll_for({"Q_POLL": raw}, tmp_path)
        assert result.returncode != 0
        assert said in result.stderr
