"""Template tags of the cleanup admin: the "needs attention" block of the admin index, and
the warning that alerts go nowhere.

May import: `cleanup.admin.lists` (the counts it shows), `cleanup.alerts` (where alerts go).
"""

from django import template
from django.urls import reverse

register = template.Library()


@register.inclusion_tag("admin/cleanup/attention.html", takes_context=True)
def needs_attention(context):
    from ..admin.lists import attention, filtered

    request = context["request"]
    counts = attention(request.user)
    links = {
        "incomplete_runs": reverse("admin:cleanup_run_changelist") + "?cleanup_status__exact=incomplete",
        "retrying": filtered("resource", needs="retrying"),
        "waiting": filtered("resource", needs="waiting"),
        "modules_down": filtered("modulehealth", state__exact="down"),
    }
    if "oldest" in counts:
        links["oldest"] = reverse("admin:cleanup_resource_change", args=[counts["oldest"]["id"]])
    return {"counts": counts, "links": links}


@register.inclusion_tag("admin/cleanup/alerts_nowhere.html")
def alerts_nowhere():
    """Says so when no alert destination is set: staff would never be told anything."""
    from ..alerts import nowhere

    return {"nowhere": nowhere()}
