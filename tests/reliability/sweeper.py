"""A sweeper process: ``python -m tests.reliability.sweeper [--passes N] [--forever] [--start-at T]``.

Sweeps until a pass attempts nothing (or N passes; ``--forever`` keeps passing until it
is killed, pausing a little between idle passes); ``--start-at`` (a Unix time) holds the
first pass until then, so that sweepers started together begin together. The recording module and its halting
hooks come from ``tests.reliability.worker_settings`` and the ``RELIABILITY_*`` variables.
"""

import argparse
import os
import sys
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=1000)
    parser.add_argument("--forever", action="store_true")
    parser.add_argument("--start-at", type=float, default=0.0)
    args = parser.parse_args()
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
