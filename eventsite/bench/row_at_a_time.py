"""The original algorithm (the reference's cleanup.js), ported row for row onto psycopg.

Each statement stands alone, as the original's data layer did: the runs needing cleanup,
then per run its unresolved rows; per step group the step, a claim per row, the module
call, a mark per row and a log entry; then the run's count, its retryable rows, its
status and its summary entry.
"""

import json
import time

from .plain_sql import LOG, RES, RUN, STEP

CLAIMABLE = (
    "state IN ('live', 'failed') AND retryable AND revert_attempts < %(max)s"
    " AND (next_attempt_at IS NULL OR next_attempt_at <= now())"
)
RUNS_NEEDING_CLEANUP = f"""
SELECT DISTINCT u.id FROM {RUN} u JOIN {RES} r ON r.run_id = u.id
WHERE u.status IN ('completed', 'cancelled', 'aborted') AND u.auto_cleanup
  AND r.state IN ('live', 'failed') AND r.retryable AND r.revert_attempts < %(max)s
  AND (r.next_attempt_at IS NULL OR r.next_attempt_at <= now())
ORDER BY u.id LIMIT %(batch)s
"""
UNRESOLVED_FOR_RUN = f"""
SELECT id, run_id, step_id, kind, ref, payload, member_key FROM {RES}
WHERE run_id = %(run)s AND {CLAIMABLE} ORDER BY id
"""
STEP_BY_ID = f"SELECT action_id, idempotency_key FROM {STEP} WHERE id = %(id)s"
CLAIM_ROW = f"""
UPDATE {RES} SET state = 'reverting', revert_attempts = revert_attempts + 1, updated_at = now()
WHERE id = %(id)s AND {CLAIMABLE} RETURNING id
"""
MARK_REVERTED = f"""
UPDATE {RES} SET state = 'reverted', last_error = '', resolved_at = now(), updated_at = now()
WHERE id = %(id)s AND state = 'reverting'
"""
FAIL_ROW = f"""
UPDATE {RES} SET state = 'failed', last_error = %(error)s, updated_at = now() WHERE id = %(id)s AND state = 'reverting'
"""
UNRESOLVED_COUNT = f"""
SELECT count(*) FROM {RES} WHERE run_id = %(run)s AND state IN ('live', 'reverting', 'failed', 'drifted')
"""
SET_STATUS = f"UPDATE {RUN} SET cleanup_status = %(status)s, updated_at = now() WHERE id = %(run)s"
WRITE_LOG = f"INSERT INTO {LOG} (run_id, kind, detail, at) VALUES (%(run)s, %(kind)s, %(detail)s::jsonb, now())"


def revert_group(conn, action, rows, params):
    step = conn.execute(STEP_BY_ID, {"id": rows[0][2]}).fetchone()
    claimed = [r for r in rows if conn.execute(CLAIM_ROW, {**params, "id": r[0]}).fetchone()]
    if not claimed:
        return 0, 0
    resources = [{"kind": r[3], "ref": r[4], "payload": r[5], "member_key": r[6]} for r in claimed]
    try:
        answer = action.revert(run_id=rows[0][1], resources=resources, idempotency_key=step[1])
    except Exception as exc:  # the original caught a throwing module too
        answer = {"ok": False, "error": str(exc)}
    ok = isinstance(answer, dict) and answer.get("ok") is True
    failed = set(map(str, answer.get("failed") or [])) if ok else {r[4] for r in claimed}
    for r in claimed:
        if r[4] in failed:
            conn.execute(FAIL_ROW, {"id": r[0], "error": f"{step[0]} could not give it back"})
        else:
            conn.execute(MARK_REVERTED, {"id": r[0]})
    detail = {"what": step[0], "resources": [f"{r[3]}:{r[4]}" for r in claimed]}
    kind = "cleanup.reverted" if not failed else "cleanup.failed"
    conn.execute(WRITE_LOG, {"run": rows[0][1], "kind": kind, "detail": json.dumps(detail)})
    return len(claimed), len(claimed) - len(failed & {r[4] for r in claimed})


def cleanup_run(conn, action, run_id, params, groups_per_run):
    rows = conn.execute(UNRESOLVED_FOR_RUN, {**params, "run": run_id}).fetchall()
    by_step = {}
    for row in rows:
        by_step.setdefault(row[2] if row[2] is not None else f"row-{row[0]}", []).append(row)
    attempted = reverted = 0
    for group in list(by_step.values())[:groups_per_run]:
        tried, done = revert_group(conn, action, group, params)
        attempted, reverted = attempted + tried, reverted + done
    remaining = conn.execute(UNRESOLVED_COUNT, {"run": run_id}).fetchone()[0]
    retryable = conn.execute(UNRESOLVED_FOR_RUN, {**params, "run": run_id}).fetchall()
    status = "complete" if remaining == 0 else "pending" if retryable else "incomplete"
    conn.execute(SET_STATUS, {"run": run_id, "status": status})
    if attempted:
        detail = {"attempted": attempted, "reverted": reverted, "remaining": remaining, "by": "bench"}
        conn.execute(WRITE_LOG, {"run": run_id, "kind": "cleanup.swept", "detail": json.dumps(detail)})
    return attempted


def sweep(conn, action, *, batch=10, groups_per_run=25, max_attempts=3, progress=lambda n: None):
    """Sweep every terminal run to the end; answers (seconds, rows claimed)."""
    params = {"max": max_attempts, "batch": batch}
    started = time.perf_counter()
    claimed = 0
    while True:
        runs = [r[0] for r in conn.execute(RUNS_NEEDING_CLEANUP, params).fetchall()]
        if not runs:
            break
        for run_id in runs:
            tried = cleanup_run(conn, action, run_id, params, groups_per_run)
            claimed += tried
            progress(tried)
    return time.perf_counter() - started, claimed
