"""How many runs there are by status and cleanup status, without counting every run.

Triggers on the runs table append each change to `models.RunTally` (migration 0021): a
scrape adds up those few rows instead of reading every run the retention window keeps,
and `fold` now and then replaces them with one row per pair (kept at zero once seen, so
a series does not vanish when its last run moves on). `counts` answers every pair of
statuses, zero where there is none.
May import: the models.
"""

from typing import Any

from django.db import connection
from django.db.models import Sum

from .models import CleanupStatus, RunStatus, RunTally

PAIRS = [(status, cleanup) for status in RunStatus.values for cleanup in CleanupStatus.values]


def counts() -> dict[tuple[str, str], int]:
    """``{(status, cleanup_status): runs}`` for every pair, in one query."""
    found = dict.fromkeys(PAIRS, 0)
    rows: Any = RunTally.objects.values("status", "cleanup_status").annotate(n=Sum("delta")).order_by()
    for row in rows:
        found[(row["status"], row["cleanup_status"])] = int(row["n"])
    return found


FOLD = """
WITH gone AS (DELETE FROM {table} RETURNING status, cleanup_status, delta)
INSERT INTO {table} (status, cleanup_status, delta)
SELECT status, cleanup_status, sum(delta) FROM gone GROUP BY status, cleanup_status
"""


def fold() -> int:
    """Replace the tally's changes by one row per pair, in one statement; answers the pairs
    kept. Changes appended meanwhile are not in its snapshot and stay as they are; two
    folds at once each take only rows the other has not, so the sums never change."""
    with connection.cursor() as cursor:
        cursor.execute(FOLD.format(table=connection.ops.quote_name(RunTally._meta.db_table)))
        folded: int = cursor.rowcount
        return folded
