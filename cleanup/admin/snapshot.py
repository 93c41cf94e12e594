"""One snapshot of the database for everything one page shows.

A run's page reads its status, its counts, its rows, its plan, its timeline and its log in
a dozen queries; read one after another under READ COMMITTED, a pass that lands between
two of them makes the page contradict itself ("complete" beside "6 unresolved"). Read in
one REPEATABLE READ transaction, every part sees the database as of the first query.
May import Django alone; the admin's pages import it.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction


@contextmanager
def snapshot() -> Iterator[None]:
    """Everything read inside sees one snapshot. Inside a transaction already begun (a
    test's), that transaction is the snapshot there is; no module is called inside (rule 4)."""
    if connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            # Must be the transaction's first statement: PostgreSQL fixes the level then.
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield
