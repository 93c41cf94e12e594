"""The scratch database the bench fills and empties, and the machine it runs on.

``BENCH_DATABASE_URL`` when set, else a database named ``eventsite_bench`` (the night's:
``eventsite_bench_night``, so that both can run at once) on the configured PostgreSQL
server. Never the configured database nor its test database: the bench truncates the
ledger.
"""

import os
import platform
from urllib.parse import quote, urlsplit

import psycopg
from django.conf import settings

DEFAULT_NAME = "eventsite_bench"
NIGHT_NAME = "eventsite_bench_night"


class BenchError(Exception):
    """The bench cannot run, or a way did not give back every row."""


def scratch_url(default_name=DEFAULT_NAME):
    url = os.environ.get("BENCH_DATABASE_URL", "").strip()
    db = settings.DATABASES["default"]
    if not url:
        if db["ENGINE"] != "django.db.backends.postgresql":
            raise BenchError(
                "the bench needs PostgreSQL: set DATABASE_URL to a PostgreSQL server "
                f"(it uses a scratch database named {default_name} on it) or BENCH_DATABASE_URL"
            )
        auth = quote(db.get("USER") or "postgres")
        if db.get("PASSWORD"):
            auth += ":" + quote(db["PASSWORD"])
        url = f"postgres://{auth}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{default_name}"
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql") or not parts.path.strip("/"):
        raise BenchError(f"BENCH_DATABASE_URL must be a postgres:// URL with a database name, not {url!r}")
    name = parts.path.strip("/")
    taken = {str(db.get("NAME")), str((db.get("TEST") or {}).get("NAME"))}
    if name in taken:
        raise BenchError(f'the bench empties its database, so it will not use "{name}", the configured one')
    return url


def ensure_database(url):
    """Create the scratch database when it is missing."""
    parts = urlsplit(url)
    name = parts.path.strip("/")
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def connect(url):
    return psycopg.connect(url, autocommit=True)


def machine(conn):
    cpu = platform.processor() or "unknown cpu"
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "postgresql": conn.execute("SHOW server_version").fetchone()[0],
        "python": platform.python_version(),
        # Other work on the machine while it ran: the figures are only as quiet as this.
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
