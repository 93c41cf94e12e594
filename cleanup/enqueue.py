"""Queueing work for django-q2 by the task's dotted path, once the caller's transaction commits.

The engine queues its own next steps (a run that ended, a pass that stopped at a bound)
through here. A task is named by its path, as django-q2 itself does, so nothing here
imports the tasks or the engine: the arrows stay one way, from the task module to the
engine and never back.
May import: nothing of the app (django-q2 is imported when a task is queued).
"""

import logging
from collections.abc import Collection

from django.db import transaction

logger = logging.getLogger(__name__)

TICK = "cleanup.tasks.tick_task"
SWEEP = "cleanup.tasks.sweep_task"
CLEANUP_RUN = "cleanup.tasks.cleanup_run_task"
CLEANUP_RUNS = "cleanup.tasks.cleanup_runs_task"
RECONCILE = "cleanup.tasks.reconcile_task"
RECONCILE_OWED = "cleanup.tasks.reconcile_owed_task"
STARTUP = "cleanup.tasks.startup_task"
WAKE = "cleanup.tasks.wake_task"
KEEPALIVE = "cleanup.tasks.keepalive_task"


def enqueue(func: str, *args: object, **kwargs: object) -> None:
    """Queue the task at dotted path ``func`` once the current transaction commits.

    Outside a transaction it is queued at once. A task that cannot be queued is logged
    and left to the schedule, which is the backstop for every queued task.
    """
    from django_q.tasks import async_task

    def send() -> None:
        try:
            async_task(func, *args, **kwargs)
        except Exception:
            logger.exception("could not queue %s", func)

    transaction.on_commit(send)


def queue_cleanup(run_id: int, actor: str | None = None) -> None:
    enqueue(CLEANUP_RUN, run_id, actor=actor, task_name=f"cleanup run {run_id}")


def queue_cleanups(run_ids: Collection[int], actor: str | None = None) -> None:
    enqueue(CLEANUP_RUNS, list(run_ids), actor=actor, task_name=f"cleanup {len(run_ids)} runs")


def queue_sweep() -> None:
    enqueue(SWEEP, task_name="cleanup sweep")


def queue_tick() -> None:
    enqueue(TICK, task_name="tick")


def queue_reconcile(module: str | None = None, restarted: bool = False, backend: str | None = None) -> None:
    """Queue a reconcile of every module, of one module, or of one backend of a module."""
    extra = {} if backend is None else {"backend": backend}
    enqueue(RECONCILE, module=module, restarted=restarted, task_name="reconcile", **extra)


def queue_owed_reconcile(module: str, backend: str = "") -> None:
    """Queue the reconcile a backend owes after a restart, to hurry it: the tick pays it anyway."""
    enqueue(RECONCILE_OWED, module=module, backend=backend, task_name="owed reconcile")


def queue_keepalive(loop: str | None = None) -> None:
    """Queue the renewal of the dead-man's switch sessions (rule 34); with ``loop``, the
    renewal loop of that token goes on."""
    enqueue(KEEPALIVE, loop=loop, task_name="keepalive")


def queue_startup() -> None:
    enqueue(STARTUP, task_name="worker start-up")
