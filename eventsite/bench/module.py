"""The bench's module: answers every revert at once, or after ``latency_ms``.

In-process, so that the figures are the engine's and the database's own cost, plus the
latency the bench asks for. It counts its calls, so each way can show that it really
called the module for every group.
"""

import threading
import time

from cleanup import registry

ACTION_ID = "bench.spawn"
MODULE = "bench"


class Instant(registry.Action):
    id = ACTION_ID
    module = MODULE

    def __init__(self, latency_ms=0):
        self.latency_s = latency_ms / 1000
        self.calls = 0
        self._lock = threading.Lock()

    def perform(self, *, run_id, step_id, params, idempotency_key):
        return {"ok": True, "resources": []}

    def revert(self, *, run_id, resources, idempotency_key):
        if self.latency_s:
            time.sleep(self.latency_s)
        with self._lock:
            self.calls += 1
        return {"ok": True, "failed": []}
