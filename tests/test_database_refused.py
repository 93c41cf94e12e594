"""A database other than PostgreSQL is refused before any connection work, by the system
check's message, for every command, `migrate` included, with no traceback (issue 43)."""

import os
import subprocess
import sys

import pytest
from django.conf import settings


@pytest.mark.parametrize("command", [["migrate"], ["check"], ["sweep"]])
def test_a_sqlite_database_is_refused_with_the_checks_message_and_no_traceback(tmp_path, command):
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'x.db'}", DEBUG="1")

    done = subprocess.run(
        [sys.executable, "manage.py", *command],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode != 0
    assert "PostgreSQL only" in done.stderr and "cleanup.E020" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert not (tmp_path / "x.db").exists(), "a connection was made before the refusal"
