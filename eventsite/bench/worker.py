"""A sweeper process for the bench: ``python -m eventsite.bench.worker --latency-ms N``.

The real sweep runs here, in a process of its own, so that its peak memory is a
sweeper's and two of them can race side by side. DATABASE_URL names the scratch
database. It answers one JSON line per command read from stdin:

- ``{"do": "migrate"}``: bring the scratch database's schema up to date.
- ``{"do": "finder", "repeat": n}``: time the engine's finder, median in ms.
- ``{"do": "sweep", "after": run_id}``: call ``cleanup.sweep.sweep()`` until no row of a
  run after ``after`` is unresolved; statements sent, seconds, peak RSS.
- ``{"do": "night", "after": run_id}``: what a bad night leaves for the metrics to show:
  the bench's backend marked down, the first step of each run after ``after`` failed past
  the attempts' ceiling, an alert not yet delivered.
- ``{"do": "scrape", "repeat": n}``: time ``/metrics``'s collector, metric by metric
  (`eventsite.bench.scrape`).
- ``{"do": "prune", "max_batches": n}``: one pruning run, as the scheduled task makes it.
"""

import argparse
import contextlib
import importlib
import inspect
import json
import resource
import statistics
import sys
import time

# The engine's finder under its public name, wherever the pass defines it; should the name
# go, the bench loses that figure (the JSON's finder is null), not its run.
FINDER = ("cleanup.sweep", "runs_needing_cleanup")
IDLE_LIMIT_S = 60


def find_finder():
    module_name, name = FINDER
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None, None
    if callable(getattr(module, name, None)):
        return f"{module_name}.{name}", getattr(module, name)
    return None, None


def time_finder(repeat):
    """Median ms of the engine's finder, called as a pass calls it.

    A finder that claims rows (it changes the ledger) is timed in a transaction rolled back
    after each call, so it leaves no trace; one that only reads is timed outside any
    transaction, as the sweep calls it (a rollback would also discard what the connection
    prepared, and time each call as a first one).
    """
    from django.db import connection, transaction
    from django.utils import timezone

    from cleanup.conf import setting

    name, finder = find_finder()
    if finder is None:
        return {"finder": None, "ms": None}
    # By name, so that the same bench times a finder that takes the pass's time (an older
    # engine's) and one that reads the database's clock itself.
    known = {"now": timezone.now(), "limit": setting("EVENT_CLEANUP_RUN_BATCH")}
    positional = [
        p
        for p in inspect.signature(finder).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    arguments = [known[p.name] for p in positional if p.name in known]
    claims = _claims(finder, arguments)
    times = []
    for _ in range(repeat):
        with transaction.atomic() if claims else contextlib.nullcontext():
            if claims:
                # The transaction's BEGIN goes out with its first statement: not the finder's cost.
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
            started = time.perf_counter()
            finder(*arguments)
            times.append((time.perf_counter() - started) * 1000)
            if claims:
                transaction.set_rollback(True)
    return {"finder": name, "ms": statistics.median(times), "claims": claims}


def _claims(finder, arguments):
    """Does a call of ``finder`` change the ledger's claims? Found out in a rolled-back transaction."""
    from django.db import transaction

    from cleanup.models import Resource

    def held():
        return Resource.objects.filter(claim_token__isnull=False).count(), Resource.objects.filter(
            state="reverting"
        ).count()

    with transaction.atomic():
        before = held()
        finder(*arguments)
        after = held()
        transaction.set_rollback(True)
    return before != after


def unresolved_after(after):
    from cleanup.models import UNRESOLVED, Resource

    return Resource.objects.filter(run_id__gt=after, state__in=UNRESOLVED).exists()


def attempted(result):
    """Did a pass work anything? None when the engine's answer does not say."""
    summary = getattr(result, "summary", None)
    value = getattr(summary, "attempted", None)
    return None if value is None else bool(value)


def sweep_to_the_end(after):
    from django.db import connection

    from cleanup.sweep import sweep

    statements = 0

    def count(execute, sql, params, many, context):
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    t0, started = time.time(), time.perf_counter()
    idle_since = None
    while True:
        with connection.execute_wrapper(count):
            result = sweep()
        if attempted(result):
            idle_since = None
            continue
        if not unresolved_after(after):
            break
        # Another sweeper holds the rest, or a backoff: wait, within reason.
        idle_since = idle_since or time.perf_counter()
        if time.perf_counter() - idle_since > IDLE_LIMIT_S:
            return {"error": f"the sweep left rows unresolved for {IDLE_LIMIT_S} s"}
        time.sleep(0.005)
    return {
        "seconds": time.perf_counter() - started,
        "t0": t0,
        "t1": time.time(),
        "statements": statements,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def bad_night(after):
    from cleanup import outages
    from cleanup.conf import max_revert_attempts
    from cleanup.models import Alert, AlertChannel, Resource, Step

    from .module import MODULE

    outages.mark_down(MODULE, by="bench", reason="the bench's backend is down")
    first_steps = Step.objects.filter(run_id__gt=after, position=0)
    failed = Resource.objects.filter(step__in=first_steps).update(
        state="failed", revert_attempts=max_revert_attempts(), last_error="bench: the module refused"
    )
    run_id = first_steps.values_list("run_id", flat=True).first()
    Alert.objects.create(run_id=run_id, event="cleanup.gave_up", channel=AlertChannel.WEBHOOK, payload={})
    return {"failed": failed}


def prune_once(max_batches):
    from cleanup.retention import prune

    t0, started = time.time(), time.perf_counter()
    result = prune(max_batches=max_batches)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "t0": t0, "t1": time.time(), "runs": result.runs, "batches": result.batches}


def serve(action):
    from django.core.management import call_command

    from .scrape import time_scrape

    handlers = {
        "migrate": lambda cmd: call_command("migrate", verbosity=0) or {},
        "finder": lambda cmd: time_finder(cmd.get("repeat", 25)),
        "sweep": lambda cmd: sweep_to_the_end(cmd["after"]),
        "night": lambda cmd: bad_night(cmd["after"]),
        "scrape": lambda cmd: time_scrape(cmd["repeat"]),
        "prune": lambda cmd: prune_once(cmd["max_batches"]),
    }
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        before = action.calls
        answer = handlers[command["do"]](command)
        print(json.dumps({**answer, "calls": action.calls - before}), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-ms", type=int, default=0)
    args = parser.parse_args()
    import django

    django.setup()
    from cleanup import registry

    from .module import Instant

    action = Instant(args.latency_ms)
    registry.register_action(action)
    serve(action)


if __name__ == "__main__":
    main()
