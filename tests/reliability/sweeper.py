"""A sweeper process: ``python -m tests.reliability.sweeper [--passes N] [--forever] [--start-at T]``.

Sweeps until a pass attempts nothing (or N passes; ``--forever`` keeps passing until it
is killed, pausing a little between idle passes); ``--start-at`` (a Unix time) holds the
first pass until then, so that sweepers started together begin together. The recording module and its halting
hooks come from ``tests.reliability.worker_settings`` and the ``RELIABILITY_*`` variables.

Under faketime (``RELIABILITY_CLOCK_OFFSET`` set, `harness.faketime`) ``time.sleep`` is
replaced by a timed wait on an Event: libfaketime 0.9.10 with its monotonic clock left real
answers Python's sleep (``clock_nanosleep`` on CLOCK_MONOTONIC, an absolute deadline) with
EINVAL, in the engine's threads as in the module's, while a timed wait works. A sleep
lasts as long either way; the engine's own timed waits are not touched.
"""

import argparse
import os
import sys
import threading
import time


def _waiting_sleep(seconds):
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    threading.Event().wait(seconds)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=1000)
    parser.add_argument("--forever", action="store_true")
    parser.add_argument("--start-at", type=float, default=0.0)
    args = parser.parse_args()
    if os.environ.get("RELIABILITY_CLOCK_OFFSET"):
        time.sleep = _waiting_sleep
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.reliability.worker_settings")
    import django

    django.setup()
    from cleanup.sweep import sweep

    by = f"pid {os.getpid()}"
    time.sleep(max(0.0, args.start_at - time.time()))
    for _ in range(args.passes):
        if sweep(by=by).summary.attempted == 0:
            if not args.forever:
                break
            time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
