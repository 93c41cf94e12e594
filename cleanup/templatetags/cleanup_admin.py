"""Template tags of the cleanup admin: the "needs attention" block of the admin index, the
live view of what is running, the live bar of a page that stays current, and the warning
that alerts go nowhere.

May import: `cleanup.admin.lists` and `cleanup.admin.live` (what they show), `cleanup.alerts`
(where alerts go), conf.
"""

from typing import Any

from django import template
from django.urls import reverse

from ..conf import setting

register = template.Library()


@register.inclusion_tag("admin/cleanup/attention.html", takes_context=True)
def needs_attention(context: template.Context) -> dict[str, Any]:
    from ..admin.lists import attention, filtered

    request = context["request"]
    counts: dict[str, Any] = attention(request.user)
    links = {
        "incomplete_runs": reverse("admin:cleanup_run_changelist") + "?cleanup_status__exact=incomplete",
        "running_runs": reverse("admin:cleanup_run_changelist") + "?status__exact=running",
        "retrying": filtered("resource", needs="retrying"),
        "waiting": filtered("resource", needs="waiting"),
        "modules_down": filtered("modulehealth", state__exact="down"),
    }
    if "oldest" in counts:
        links["oldest"] = reverse("admin:cleanup_resource_change", args=[counts["oldest"]["id"]])
    return {"counts": counts, "links": links}


@register.inclusion_tag("admin/cleanup/alerts_nowhere.html")
def alerts_nowhere() -> dict[str, bool]:
    """Says so when no alert destination is set: staff would never be told anything."""
    from ..alerts import nowhere

    return {"nowhere": nowhere()}


@register.inclusion_tag("admin/cleanup/live_now.html", takes_context=True)
def live_now(context: template.Context) -> dict[str, Any]:
    from ..admin.live import live_now as running

    return running(context["request"])


@register.inclusion_tag("admin/cleanup/live_bar.html")
def live_bar(src: str) -> dict[str, Any]:
    """The bar of a page that stays current: reads ``src`` every EVENT_ADMIN_REFRESH_S while live."""
    return {"src": src, "every": setting("EVENT_ADMIN_REFRESH_S")}
