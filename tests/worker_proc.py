"""A sweeper or a ticker in its own process, for the concurrency tests.

    python -m tests.worker_proc CALLS_FILE [--tick] [--hang] [--passes N] [--delay S]

Registers `conc.spawn`, whose perform and revert append one line per call to CALLS_FILE
(the verb, its pid, the step's key and the refs) and then answer success, or with --hang
first write the line and then block for ever, as a worker that is about to be killed.
Then it sweeps (or, with --tick, ticks) until a pass finds nothing, or N passes.
DATABASE_URL names the database.
"""

import argparse
import json
import os
import sys
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("calls")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--tick", action="store_true")
    parser.add_argument("--passes", type=int, default=50)
    parser.add_argument("--delay", type=float, default=0.02)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventsite.settings")
    os.environ.setdefault("DEBUG", "1")
    import django

    django.setup()
    from cleanup import registry
    from cleanup.models import Run, RunStatus
    from cleanup.runner import tick
    from cleanup.sweep import sweep

    def note(verb, key, refs):
        line = json.dumps({"verb": verb, "pid": os.getpid(), "key": key, "refs": refs})
        with open(args.calls, "a") as out:
            out.write(line + "\n")
        if args.hang:
            time.sleep(3600)
        time.sleep(args.delay)

    class Spawn(registry.Action):
        id = "conc.spawn"
        module = "conc"

        def perform(self, *, run_id, step_id, params, idempotency_key):
            ref = f"orc-{idempotency_key}"
            note("perform", idempotency_key, [ref])
            return {"ok": True, "resources": [{"kind": "creature", "ref": ref}]}

        def revert(self, *, run_id, resources, idempotency_key):
            note("revert", idempotency_key, [r["ref"] for r in resources])
            return {"ok": True, "failed": []}

    registry.register_action(Spawn())
    by = f"pid {os.getpid()}"
    for _ in range(args.passes):
        if args.tick:
            result = tick(by=by)
            if not Run.objects.filter(status=RunStatus.RUNNING).exists() and result.sweep.summary.attempted == 0:
                break
        elif sweep(by=by).summary.attempted == 0:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
