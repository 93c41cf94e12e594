"""Template tags of the cleanup admin: the "needs attention" block of the admin index, the
live view of what is running, the live bar of a page that stays current, and the warning
that alerts go nowhere.

May import: `cleanup.admin.lists`, `cleanup.admin.live`, `cleanup.admin.charts` (what they show),
`cleanup.admin.idents` (an identifier shown whole), `cleanup.alerts` (where alerts go), conf.
"""

from typing import Any

from django import template
from django.urls import reverse
from django.utils.safestring import SafeString

from ..admin.idents import whole_id as _whole_id
from ..conf import setting

register = template.Library()


@register.filter
def whole_id(value: object) -> SafeString:
    """An identifier (a ref) whole, as the admin's lists show it, with its copy button."""
    return _whole_id(str(value))


@register.inclusion_tag("admin/cleanup/attention.html", takes_context=True)
def needs_attention(context: template.Context) -> dict[str, Any]:
    from ..admin.lists import attention, filtered

    request = context["request"]
    counts = attention(request.user)
    links = {
        "incomplete_runs": reverse("admin:cleanup_run_changelist") + "?cleanup_status__exact=incomplete",
        "running_runs": reverse("admin:cleanup_run_changelist") + "?status__exact=running",
        "retrying": filtered("resource", needs="retrying"),
        "waiting": filtered("resource", needs="waiting"),
        "left_runs": reverse("admin:cleanup_run_changelist") + "?cleanup_status__exact=left",
        "left": filtered("resource", needs="left"),
        "modules_down": filtered("modulehealth", state__exact="down"),
    }
    if "oldest" in counts:
        links["oldest"] = reverse("admin:cleanup_resource_change", args=[counts["oldest"]["id"]])
    return {"counts": counts, "links": links}


@register.inclusion_tag("admin/cleanup/charts.html", takes_context=True)
def night_charts(context: template.Context) -> dict[str, Any]:
    """Rows given back per minute, module calls' latency and failures by backend, for staff
    who may read the ledger (`cleanup.admin.charts`)."""
    from ..admin import charts

    if not context["request"].user.has_perm("cleanup.view_resource"):
        return {"charts": None}
    return {
        "charts": {
            "given_back": charts.given_back_per_minute(),
            "latency": charts.latency_by_backend(),
            "failures": charts.failures_by_backend(),
        }
    }


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
