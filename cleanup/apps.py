"""The app's configuration: what happens when Django loads the app.

It registers the system checks and the built-in actions, revokes a user's API tokens with
the password (`api.tokens`), readies PostgreSQL connections for the pass's prepared
statements (and a forked process for connections of its own), ensures the tick's schedule
after `migrate`, and has
a django-q2 worker that starts reconcile every module (rule 10).
May import: anything of the app, lazily in `ready()`.
"""

import os

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class CleanupConfig(AppConfig):
    _fork_hook = False  # registered once, however often the app is readied
    name = "cleanup"
    verbose_name = "Events and cleanup"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.exceptions import ImproperlyConfigured

        from .checks import check_database_is_postgresql

        # PostgreSQL only (cleanup.E020), refused here, before any connection is made: every
        # command, `migrate` included, ends with the check's message and no traceback
        # (`manage.py` prints an ImproperlyConfigured as one line).
        for refused in check_database_is_postgresql():
            raise ImproperlyConfigured(f"{refused.msg} {refused.hint} ({refused.id})")
        from django.contrib.auth import get_user_model
        from django.contrib.auth.signals import user_logged_in
        from django.core.signals import request_finished
        from django.db.backends.signals import connection_created
        from django_q.signals import post_spawn

        from . import (
            checks,  # noqa: F401  (registers the system checks)
            outages,
            registry,
            security,
        )
        from .api import tokens
        from .counters import flush_after_request
        from .runner import register_builtins
        from .sql import forget_inherited_connections, ready_new_connection
        from .tasks import on_worker_start

        post_migrate.connect(_ensure_schedule_after_migrate, sender=self)
        connection_created.connect(ready_new_connection, dispatch_uid="cleanup.ready_new_connection")
        if not CleanupConfig._fork_hook:
            os.register_at_fork(after_in_child=forget_inherited_connections)
            CleanupConfig._fork_hook = True
        post_spawn.connect(on_worker_start, dispatch_uid="cleanup.on_worker_start")
        # What a request counted for the metrics is written when it ends (`cleanup.counters`).
        request_finished.connect(flush_after_request, dispatch_uid="cleanup.counters.flush")
        register_builtins()
        # A module that reports its backend restarted makes the backend owe a reconcile (rule 14).
        registry.restart_reported.connect(outages.restart_reported, dispatch_uid="cleanup.outages.restart_reported")
        # A user's API tokens are revoked when the password changes or the user is deactivated.
        tokens.connect(get_user_model())
        user_logged_in.connect(security.note_login, dispatch_uid="cleanup.security.note_login")


def _ensure_schedule_after_migrate(sender: AppConfig, using: str | None = None, **kwargs: object) -> None:
    from .tasks import ensure_schedule

    ensure_schedule()
