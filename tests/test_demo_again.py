"""`make demo` a second time in the same clone: the same password, no alert about the first
one's end, and the README's examples of the API answer on it as printed."""

import re
import subprocess
import time

import httpx
import psycopg
import pytest
from django.conf import settings

from tests.databases import scratch_database  # noqa: F401  (the fixture)
from tests.demo import Demo

pytestmark = pytest.mark.slow

README = settings.BASE_DIR / "README.md"


def readme_examples():
    """The README's token command and its curl example, each as one line of shell."""
    text = README.read_text()
    token = re.search(r"^    (DEBUG=1 \.venv/bin/python manage\.py create_token demo)", text, re.M)[1]
    curl = re.search(r"^    (curl .*?)\n\n", text, re.M | re.S)[1]
    return token, " ".join(part.strip() for part in curl.replace("\\\n", " ").split())


def one_line(command):
    return " ".join(command.split())


def password_of(demo):
    return re.search(r"user demo\s+password (\S+)", demo.read_until("ready: admin", 180))[1]


@pytest.mark.timeout(400)
def test_a_second_demo_keeps_the_password_tells_no_false_alert_and_answers_the_readme(tmp_path, scratch_database):  # noqa: F811
    token_command, curl = readme_examples()
    first = Demo(tmp_path, story=False, database_url=scratch_database)
    try:
        password = password_of(first)
        printed = first.read_until("start a run with it (README):", 20).split("(README):", 1)[1].strip()
        assert one_line(printed) == one_line(curl.replace("http://127.0.0.1:8000", first.url))
        # The README's commands, pasted in a shell where `. var/demo-env.sh` was run.
        shell = f". {tmp_path}/demo-env.sh && TOKEN=$({token_command}) && {printed} -s -o /dev/null -w '%{{http_code}}'"
        answered = subprocess.run(
            ["bash", "-c", shell], cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=90
        )
        assert answered.stdout == "201", answered.stderr
        token = subprocess.run(
            ["bash", "-c", f". {tmp_path}/demo-env.sh && {token_command}"],
            cwd=settings.BASE_DIR,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
        auth = {"Authorization": f"Token {token}"}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # the raid spawns on north, ends and is given back
            runs = httpx.get(f"{first.url}/api/v1/events/runs/", headers=auth, timeout=5).json()["results"]
            if runs and runs[0]["cleanup_status"] == "complete":
                break
            time.sleep(2)
        assert runs[0]["name"] == "raid" and runs[0]["cleanup_status"] == "complete", runs
    finally:
        first.stop()

    second = Demo(tmp_path, story=False, database_url=scratch_database)
    try:
        assert password_of(second) == password, "a second start changed the demo's password"
        # The password was not set again: the token made under the first start still answers.
        assert httpx.get(f"{second.url}/api/v1/events/runs/", headers=auth, timeout=5).status_code == 200
        time.sleep(20)  # a few ticks and probes of the shards the first demo left
    finally:
        rest = second.stop()
    told = "".join(second.lines) + rest
    assert "alert sent to staff" not in told, told
    with psycopg.connect(scratch_database) as conn:
        events = conn.execute("SELECT module, backend, kind FROM cleanup_moduleevent").fetchall()
    assert events == [], "the demos' shards were never down"
