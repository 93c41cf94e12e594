"""Ended runs written into the database of ``DATABASE_URL``, from a process of its own:
``python -m tests.reliability.seed RUNS STEPS ROWS`` (`ledger.ended_runs`).

For a database the test process is not connected to, such as a private server's
(`privatepg`).
"""

import argparse
import os
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", type=int)
    parser.add_argument("steps", type=int)
    parser.add_argument("rows", type=int)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.reliability.worker_settings")
    import django

    django.setup()
    from tests.reliability.ledger import ended_runs

    ended_runs(runs=args.runs, steps=args.steps, rows=args.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
