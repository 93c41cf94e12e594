"""Halting a worker process at a chosen point of a pass, from outside the engine.

``RELIABILITY_HALT=SIGNAL:POINT:N`` (``kill`` or ``stop``) sends the process SIGKILL or
SIGSTOP the N-th time it reaches POINT:

- ``before_call``: a group is claimed and its module call is about to start;
- ``during_call``: the module has started the call and not answered;
- ``after_answer``: the module answered, and the sweeper has written nothing yet (at
  its next SQL statement);
- ``after_verdict``: a verdict on ledger rows is durable (the statement that wrote it in
  autocommit, or the commit of its transaction), before whatever the sweeper does next.

The points are found from the module's own calls and from the SQL the process sends
(a database wrapper on every connection, and the connections' commit), so the engine
itself is not patched and may change its inside freely.
"""

import os
import re
import signal
import threading
from collections import Counter

_lock = threading.Lock()
_plan = None  # (signal, point, n)
_seen = Counter()
_state = {"answered": False, "verdict_pending": False}

VERDICT_STATES = ("reverted", "failed", "drifted")


def install_from_environment():
    global _plan
    raw = os.environ.get("RELIABILITY_HALT", "").strip()
    if not raw:
        return
    how, point, n = raw.split(":")
    _plan = ({"kill": signal.SIGKILL, "stop": signal.SIGSTOP}[how], point, int(n))
    from django.db.backends.signals import connection_created

    connection_created.connect(_watch_connection, weak=False)


def reached(point):
    if _plan is None or _plan[1] != point:
        return
    with _lock:
        _seen[point] += 1
        due = _seen[point] == _plan[2]
    if due:
        os.kill(os.getpid(), _plan[0])


def answered():
    _state["answered"] = True


_WHERE = re.compile(r"\bwhere\b", re.IGNORECASE)
_STATE = re.compile(r'(?:^|[\s,."])state"?\s*=\s*', re.IGNORECASE)


_LEDGER_UPDATE = re.compile(r'\bupdate\s+"?cleanup_resource"?', re.IGNORECASE)


def _is_verdict(sql, params):
    """An UPDATE of ledger rows whose SET moves them to a verdict's state (not a claim's),
    alone or as a part of a statement (``WITH w0 AS (UPDATE ...) ...``).

    Reads Django's SQL (``"state" = %s``) and hand-written SQL (``state = 'reverted'``,
    ``state = v.state``) alike; a SET that names the claim's state is a claim.
    """
    text = sql.lstrip()
    if text[:6].lower() != "update" and text[:4].lower() != "with":
        return False
    return any(_sets_a_verdict(text, found.start(), params) for found in _LEDGER_UPDATE.finditer(text))


def _sets_a_verdict(text, start, params):
    """Does the UPDATE of ledger rows at ``start`` of ``text`` set a verdict's state?"""
    where = _WHERE.search(text, start)
    assignments = text[start : where.start() if where else len(text)]
    match = _STATE.search(assignments.split(" SET ", 1)[-1] if " SET " in assignments else assignments)
    if match is None:
        return False
    offset = assignments.find(match.group(0))
    value = assignments[offset + len(match.group(0)) :].lstrip()
    if value.startswith("%s"):
        index = text[: start + offset].count("%s")
        return isinstance(params, list | tuple) and len(params) > index and params[index] in VERDICT_STATES
    if value.startswith("'"):
        return any(value.startswith(f"'{s}'") for s in VERDICT_STATES)
    # A SET from per-row values (``state = CASE ... v.state ...``): a claim would name its
    # state in the SET itself, as a literal or the parameter read above.
    return "reverting" not in assignments


def _wrapper(execute, sql, params, many, context):
    if _state["answered"]:
        _state["answered"] = False
        reached("after_answer")
    result = execute(sql, params, many, context)
    if _is_verdict(sql, params) and context["cursor"].rowcount > 0:
        if context["connection"].in_atomic_block:
            _state["verdict_pending"] = True
        else:
            reached("after_verdict")
    return result


def _watch_connection(sender, connection, **kwargs):
    if _wrapper in connection.execute_wrappers:
        return
    connection.execute_wrappers.append(_wrapper)
    commit = connection.commit
    rollback = connection.rollback

    def commit_then_halt():
        commit()
        if _state["verdict_pending"]:
            _state["verdict_pending"] = False
            reached("after_verdict")

    def rollback_forgets():
        _state["verdict_pending"] = False
        rollback()

    connection.commit = commit_then_halt
    connection.rollback = rollback_forgets
