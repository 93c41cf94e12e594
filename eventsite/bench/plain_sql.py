"""The bench's batched sweep in plain SQL: how close to the database's limit a sweep can get.

Per batch of runs: one statement finds the runs (skipping those another sweeper holds)
and claims their claimable rows, returning what the calls need; the module is called once
per step group, several at once; then one transaction writes every verdict, one log
insert for the batch (a verdict entry per group, a summary per run) and the runs'
cleanup statuses. Claim tokens fence the verdict as in the engine.
"""

import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from cleanup.models import Resource, Run, RunLog, Step

from .module import ACTION_ID

RES, RUN, STEP, LOG = (m._meta.db_table for m in (Resource, Run, Step, RunLog))
CLAIMABLE = (
    "{r}.state IN ('live', 'failed') AND {r}.retryable AND {r}.revert_attempts < %(max)s"
    " AND ({r}.next_attempt_at IS NULL OR {r}.next_attempt_at <= now())"
)

CLAIM = f"""
WITH runs AS (
    SELECT id FROM {RUN} WHERE id IN (
        SELECT DISTINCT r.run_id FROM {RES} r JOIN {RUN} u ON u.id = r.run_id
        WHERE {CLAIMABLE.format(r="r")} AND u.status IN ('completed', 'cancelled', 'aborted') AND u.auto_cleanup
        ORDER BY r.run_id LIMIT %(batch)s)
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE {RES} r SET state = 'reverting', claim_token = %(token)s,
        claim_expires_at = now() + make_interval(secs => %(timeout)s),
        revert_attempts = r.revert_attempts + 1, updated_at = now()
    FROM runs WHERE r.run_id = runs.id AND {CLAIMABLE.format(r="r")}
    RETURNING r.id, r.run_id, r.step_id, r.kind, r.ref, r.payload, r.member_key
)
SELECT c.id, c.run_id, c.step_id, c.kind, c.ref, c.payload, c.member_key, s.action_id, s.idempotency_key
FROM claimed c LEFT JOIN {STEP} s ON s.id = c.step_id ORDER BY c.id
"""

VERDICT = f"""
UPDATE {RES} r SET state = v.state, last_error = v.error,
    resolved_at = CASE WHEN v.state = 'reverted' THEN now() END,
    next_attempt_at = CASE WHEN v.state = 'failed' THEN now() + make_interval(secs => %(backoff)s) END,
    claim_token = NULL, claim_expires_at = NULL, updated_at = now()
FROM unnest(%(ids)s::bigint[], %(states)s::text[], %(errors)s::text[]) AS v(id, state, error)
WHERE r.id = v.id AND r.state = 'reverting' AND r.claim_token = %(token)s
"""

LOG_INSERT = f"""
INSERT INTO {LOG} (run_id, kind, detail, at)
SELECT run_id, kind, detail, now() FROM unnest(%(runs)s::bigint[], %(kinds)s::text[], %(details)s::jsonb[])
    AS l(run_id, kind, detail)
"""

STATUS = f"""
UPDATE {RUN} u SET cleanup_status = CASE WHEN EXISTS (
        SELECT 1 FROM {RES} r WHERE r.run_id = u.id AND r.state IN ('live', 'reverting', 'failed', 'drifted')
    ) THEN 'pending' ELSE 'complete' END, updated_at = now()
WHERE u.id = ANY(%(runs)s)
"""


def group_rows(rows):
    groups = {}
    for row in rows:
        groups.setdefault(row[2] if row[2] is not None else f"row-{row[0]}", []).append(row)
    return list(groups.values())


def call_group(action, rows):
    """One revert for a step's rows; answers (ids done, {id: error})."""
    first = rows[0]
    resources = [{"kind": r[3], "ref": r[4], "payload": r[5], "member_key": r[6]} for r in rows]
    try:
        answer = action.revert(run_id=first[1], resources=resources, idempotency_key=first[8] or first[4])
    except Exception as exc:  # the bench's module does not throw; a broken one must not stop the bench
        answer = {"ok": False, "error": str(exc)}
    if not isinstance(answer, dict) or answer.get("ok") is not True:
        error = str(answer.get("error")) if isinstance(answer, dict) else "no envelope"
        return [], {r[0]: error for r in rows}
    failed = set(map(str, answer.get("failed") or []))
    return [r[0] for r in rows if r[4] not in failed], {
        r[0]: f"{ACTION_ID} could not give it back" for r in rows if r[4] in failed
    }


def write_verdicts(conn, token, groups, outcomes, backoff_s):
    ids, states, errors, runs, kinds, details, per_run = [], [], [], [], [], [], {}
    for rows, (done, failed) in zip(groups, outcomes, strict=True):
        verdicts = [(row_id, "reverted", "") for row_id in done] + [(i, "failed", e) for i, e in failed.items()]
        for row_id, state, error in verdicts:
            ids.append(row_id)
            states.append(state)
            errors.append(error)
        run_id = rows[0][1]
        tally = per_run.setdefault(run_id, {"attempted": 0, "reverted": 0, "failed": 0})
        tally["attempted"] += len(rows)
        tally["reverted"] += len(done)
        tally["failed"] += len(failed)
        runs.append(run_id)
        kinds.append("cleanup.failed" if failed else "cleanup.reverted")
        details.append(json.dumps({"what": ACTION_ID, "resources": [f"{r[3]}:{r[4]}" for r in rows]}))
    for run_id, tally in per_run.items():
        runs.append(run_id)
        kinds.append("cleanup.swept")
        details.append(json.dumps({**tally, "by": "bench"}))
    with conn.transaction():
        conn.execute(VERDICT, {"ids": ids, "states": states, "errors": errors, "token": token, "backoff": backoff_s})
        conn.execute(LOG_INSERT, {"runs": runs, "kinds": kinds, "details": details})
        conn.execute(STATUS, {"runs": list(per_run)})


def sweep(
    conn, action, *, batch=10, concurrency=8, max_attempts=3, timeout_s=120, backoff_s=30, progress=lambda n: None
):
    """Sweep every terminal run to the end; answers (seconds, batches, rows claimed)."""
    started = time.perf_counter()
    batches = claimed = 0
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        while True:
            token = uuid.uuid4()
            rows = conn.execute(
                CLAIM, {"max": max_attempts, "batch": batch, "token": token, "timeout": timeout_s}
            ).fetchall()
            if not rows:
                break
            groups = group_rows(rows)
            outcomes = list(pool.map(lambda g: call_group(action, g), groups))
            write_verdicts(conn, token, groups, outcomes, backoff_s)
            batches += 1
            claimed += len(rows)
            progress(len(rows))
    return time.perf_counter() - started, batches, claimed
