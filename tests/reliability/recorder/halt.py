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


def _is_verdict(sql, params):
    """An UPDATE of ledger rows whose SET puts them in a verdict's state (not a claim's)."""
    text = sql.lstrip()
    if not (text[:6].lower() == "update" and "cleanup_resource" in text):
        return False
    assignments = text.split(" WHERE ", 1)[0]
    marker = '"state" = '
    at = assignments.find(marker)
    if at < 0:
        return False
    value = assignments[at + len(marker):].lstrip()
    if value.startswith("%s"):
        index = assignments[:at].count("%s")
        return isinstance(params, list | tuple) and len(params) > index and params[index] in VERDICT_STATES
    return any(value.startswith(f"'{s}'") for s in VERDICT_STATES)


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
