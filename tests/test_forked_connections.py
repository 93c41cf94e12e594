"""A forked process (django-q2's workers, pusher and monitor) queries on connections of its own.

The production recipe sets DATABASE_POOL_MAX_SIZE for every process, the cluster's too: a
child forked from a process whose pool held an open connection took that connection from
the inherited pool, and two processes spoke on one session (the cluster's broker failed
with "the last operation didn't produce records"). `cleanup.sql.forget_inherited_connections`
runs in every forked child.
"""

import json
import os

import pytest
from django.db import connection, connections

pytestmark = pytest.mark.django_db(transaction=True)


def in_a_forked_child(work):
    """Run ``work()`` in a forked child; answers what it returned (JSON), or its error."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, then leave without running anything of pytest's
        os.close(read)
        try:
            answer = {"value": work()}
        except BaseException as exc:  # noqa: BLE001  (the parent reports it)
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write, json.dumps(answer).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    answer = json.loads(b"".join(chunks))
    assert "error" not in answer, answer["error"]
    return answer["value"]


def backend_pid(wrapper):
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def test_a_forked_child_opens_its_own_connection_and_leaves_the_parents_open():
    parent = backend_pid(connection)
    child = in_a_forked_child(lambda: backend_pid(connection))
    assert child != parent, "the child spoke on the parent's session"
    # The child did not close the parent's session on its way out.
    assert backend_pid(connection) == parent


def test_a_forked_child_does_not_take_a_connection_from_the_parents_pool():
    settings_dict = {
        **connection.settings_dict,
        "CONN_MAX_AGE": 0,
        "OPTIONS": {**connection.settings_dict["OPTIONS"], "pool": {"min_size": 1, "max_size": 1}},
    }
    # A wrapper of its own on the same alias: the test database's own connection has no pool.
    # A pool of one connection: the parent's is the one a child could take, and the one the
    # parent gets again (a pool of two hands them out in turn).
    pooled = type(connections[connection.alias])(settings_dict, alias=connection.alias)
    try:
        parent = backend_pid(pooled)
        pooled.close()  # back to the pool, which keeps it open: what a child would inherit
        child = in_a_forked_child(lambda: backend_pid(pooled))
        assert child != parent, "the child took the parent's pooled connection"
        assert backend_pid(pooled) == parent, "the parent's pooled connection was closed by the child"
    finally:
        pooled.close()
        pooled.close_pool()
