"""`rel.spawn` and `rel.rate`: a module whose every call is recorded in a file.

Refs choose the behaviour of a revert, as a poison pill would: ``raise-…`` raises,
``hang-…`` never answers, ``kill-…`` kills its own process, ``fail-…`` answers a
retryable refusal. ``RELIABILITY_ANSWER=error`` makes every call refuse (a stale
sweeper's answer); ``RELIABILITY_DELAY`` is how long a call takes, in seconds: a number,
or ``LOW-HIGH`` for a time drawn at random between them for each call.
"""

import fcntl
import json
import os
import random
import signal
import time
import uuid

from cleanup import registry

from . import halt


def _now():
    """The true time: a process under faketime says by ``RELIABILITY_CLOCK_OFFSET`` how far
    off its clock is, so that its calls compare with other processes' calls."""
    return time.time() - float(os.environ.get("RELIABILITY_CLOCK_OFFSET", "0"))


def _append(line):
    with open(os.environ["RELIABILITY_CALLS"], "a") as out:
        out.write(json.dumps(line) + "\n")


class Call:
    """One recorded call: a `start` line now, an `end` line when it answers."""

    def __init__(self, verb, key, refs):
        self.id = uuid.uuid4().hex
        _append(
            {
                "ev": "start",
                "id": self.id,
                "verb": verb,
                "key": key,
                "refs": refs,
                "pid": os.getpid(),
                "cluster": os.environ.get("RELIABILITY_CLUSTER"),
                "t": _now(),
            }
        )

    def end(self, answer):
        _append({"ev": "end", "id": self.id, "pid": os.getpid(), "t": _now(), "ok": answer.get("ok") is True})
        halt.answered()
        return answer


def _delay():
    raw = os.environ.get("RELIABILITY_DELAY", "0.005")
    low, _, high = raw.partition("-")
    return random.uniform(float(low), float(high)) if high else float(low)


def _behave(refs):
    """The answer the refs ask for, after the call's delay (or no answer at all)."""
    if any(r.startswith("kill-") for r in refs):
        os.kill(os.getpid(), signal.SIGKILL)
    if any(r.startswith("hang-") for r in refs):
        time.sleep(3600)
    time.sleep(_delay())
    if any(r.startswith("raise-") for r in refs):
        raise RuntimeError("poison: the shard blew up")
    if os.environ.get("RELIABILITY_ANSWER") == "error" or any(r.startswith("fail-") for r in refs):
        return {"ok": False, "error": f"shard refused in pid {os.getpid()}"}
    return None


class Spawn(registry.Action):
    id = "rel.spawn"
    module = "rel"

    def perform(self, *, run_id, step_id, params, idempotency_key):
        refs = [f"{params.get('prefix', 'orc')}-{idempotency_key}-{i}" for i in range(params.get("count", 1))]
        call = Call("perform", idempotency_key, refs)
        time.sleep(_delay())
        return call.end({"ok": True, "resources": [{"kind": "creature", "ref": ref} for ref in refs]})

    def revert(self, *, run_id, resources, idempotency_key):
        refs = [r["ref"] for r in resources]
        halt.reached("before_call")
        call = Call("revert", idempotency_key, refs)
        halt.reached("during_call")
        try:
            refused = _behave(refs)
        except Exception:
            call.end({"ok": False})
            raise
        return call.end(refused or {"ok": True, "failed": []})


class Store:
    """Lease values shared by every process, in a JSON file under a lock."""

    def __init__(self):
        self.path = os.environ["RELIABILITY_STORE"]

    def change(self, fn):
        with open(self.path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            values = json.loads(f.read() or "{}")
            answer = fn(values)
            f.seek(0)
            f.truncate()
            f.write(json.dumps(values))
            return answer


class Rate(registry.Lease):
    id = "rel.rate"
    module = "rel"

    def read(self, *, target):
        return {"ok": True, "value": Store().change(lambda values: values.get(target))}

    def apply(self, *, value, run_id, target):
        Store().change(lambda values: values.__setitem__(target, value))
        return {"ok": True}

    def restore(self, *, baseline, expected, run_id, target):
        ref = registry.lease_ref(self.id, target)
        halt.reached("before_call")
        call = Call("restore", f"{run_id}:{target}", [ref])
        halt.reached("during_call")

        def put_back(values):
            current = values.get(target)
            if current == baseline:
                return {"ok": True}
            if current != expected:
                return {"ok": False, "drifted": True, "current": current}
            values[target] = baseline
            return {"ok": True}

        refused = _behave([ref])
        return call.end(refused or Store().change(put_back))
