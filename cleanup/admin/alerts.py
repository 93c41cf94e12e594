"""The alerts outbox's page: what staff were told, read-only.

May import models and `.lists`; nothing imports it but the package.
"""

from django.contrib import admin
from django.utils.safestring import SafeString

from ..models import Alert
from .lists import ReadOnlyAdmin, run_link, when


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    """The alerts outbox: what staff were told, by which channel, and what a failed send said."""

    list_display = ["created", "run_name", "event", "channel", "sent", "attempts", "last_error"]
    list_filter = ["event", "channel"]
    list_select_related = ["run"]
    ordering = ["-id"]
    fields = (
        "run_name",
        "module",
        "event",
        "channel",
        "created",
        "sent",
        "attempts",
        "next_attempt_at",
        "last_error",
        "payload",
    )
    readonly_fields = fields

    @admin.display(description="created")
    def created(self, obj: Alert) -> str:
        shown: str = when(obj.created_at)
        return shown

    @admin.display(description="sent")
    def sent(self, obj: Alert) -> str:
        shown: str = when(obj.sent_at) if obj.sent_at else "not yet"
        return shown

    @admin.display(description="about")
    def run_name(self, obj: Alert) -> str | SafeString:
        if obj.run is None:
            return f"module {obj.module}"
        link: SafeString = run_link(obj.run.pk, obj.run.name)
        return link
