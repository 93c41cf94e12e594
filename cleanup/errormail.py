"""Error mail that cannot be used against the site: queued, never sent inside a request, and
at most one per distinct error within ``EVENT_ERROR_MAIL_INTERVAL_S``.

`QueuedAdminEmailHandler` replaces Django's ``AdminEmailHandler`` in the site's logging: it
builds the same subject and text, then queues Django's ``mail_admins`` as a django-q2
task instead of talking to the SMTP server, so a slow or silent server holds no request.
An error is the same error when it has the same logger, the same kind (the exception's
class, or the message's template such as "Internal Server Error: %s") and is raised at
the same place (file and line of the innermost frame): a flood of one error mails once per
interval for the whole site (counted in the counters every process shares,
`cleanup.limits`). A mail that cannot be queued is dropped; the console's log of the error
stays.

May import: conf, limits (and Django, django-q2 when a mail is queued); nothing imports it
but the ``LOGGING`` setting.
"""

import hashlib
import logging
from typing import TYPE_CHECKING, Any

from django.utils.log import AdminEmailHandler

from . import limits
from .conf import setting

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

logger = logging.getLogger("cleanup.errormail")
MAIL_ADMINS = "django.core.mail.mail_admins"


def fingerprint(record: logging.LogRecord) -> str:
    """What makes two log records the same error."""
    parts = [record.name, str(record.levelno)]
    if record.exc_info and record.exc_info[0] is not None:
        kind, _, tb = record.exc_info
        parts.append(f"{kind.__module__}.{kind.__qualname__}")
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None:
            parts.append(f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}")
    else:
        parts.append(str(record.msg))
        status = getattr(record, "status_code", None)
        if status is not None:
            parts.append(str(status))
    return hashlib.sha256("\n".join(parts).encode("utf-8", "replace")).hexdigest()


def first_in_interval(record: logging.LogRecord) -> bool:
    """True for the first record of its error within the interval (then it is mailed)."""
    interval: int = setting("EVENT_ERROR_MAIL_INTERVAL_S")
    if interval <= 0:
        return True
    try:
        return limits.counters().add(f"cleanup:error-mail:{fingerprint(record)}", 1, interval)
    except Exception:  # a cache that is down: mail, as without the bound
        return True


class QueuedAdminEmailHandler(AdminEmailHandler):
    """Django's error mail, queued for the cluster and bounded per distinct error."""

    def emit(self, record: logging.LogRecord) -> None:
        if first_in_interval(record):
            super().emit(record)

    def send_mail(self, subject: "StrOrPromise", message: "StrOrPromise", *args: Any, **kwargs: Any) -> None:
        try:
            from django_q.tasks import async_task

            async_task(MAIL_ADMINS, subject, message, fail_silently=True, html_message=kwargs.get("html_message"))
        except Exception:
            logger.warning("an error mail could not be queued: %s", subject, exc_info=True)
