"""Databases of their own, on the test server, for the processes a test starts."""

import itertools
import os

import psycopg
import pytest
from django.conf import settings
from psycopg import sql

_made = itertools.count()


def server_url(name):
    """The URL of the database ``name`` on the server the tests run on."""
    db = settings.DATABASES["default"]
    auth = (db.get("USER") or "postgres") + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{name}"


@pytest.fixture
def scratch_database():
    """An empty database on the test server, dropped after the test: answers its URL."""
    name = f"scratch_{os.getpid()}_{next(_made)}"
    with psycopg.connect(server_url("postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield server_url(name)
    with psycopg.connect(server_url("postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
