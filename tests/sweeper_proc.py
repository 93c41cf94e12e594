"""A sweeper in its own process, for the concurrency tests.

    python -m tests.sweeper_proc CALLS_FILE [--hang] [--passes N] [--delay S]

Registers `conc.spawn`, whose revert appends one line per call to CALLS_FILE (its pid and
the refs it was given) and then answers success, or with --hang first writes the line
and then blocks for ever, as a worker that is about to be killed. Then it sweeps until a
pass finds nothing, or N passes. DATABASE_URL names the database.
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
    parser.add_argument("--passes", type=int, default=50)
    parser.add_argument("--delay", type=float, default=0.02)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventsite.settings")
    os.environ.setdefault("DEBUG", "1")
    import django

    django.setup()
    from cleanup import registry
    from cleanup.sweep import sweep

    class Spawn(registry.Action):
        id = "conc.spawn"
        module = "conc"

        def revert(self, *, run_id, resources, idempotency_key):
            line = json.dumps({"pid": os.getpid(), "key": idempotency_key,
                               "refs": [r["ref"] for r in resources]})
            with open(args.calls, "a") as out:
                out.write(line + "\n")
            if args.hang:
                time.sleep(3600)
            time.sleep(args.delay)
            return {"ok": True, "failed": []}

        def perform(self, **kwargs):
            return {"ok": False, "error": "not used here"}

    registry.register_action(Spawn())
    for _ in range(args.passes):
        if sweep(by=f"pid {os.getpid()}").summary.attempted == 0:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
