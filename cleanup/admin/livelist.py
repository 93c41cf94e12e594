"""A list page that stays current: its rows again, with the list's own filters and page.

The ledger's list and module health carry a live bar (`cleanup.admin.live`); every
``EVENT_ADMIN_REFRESH_S`` its script reads the list's ``live/`` fragment, `LiveListMixin.live_rows`,
behind the list's view permission, checked before any query. A model admin mixes it in,
names its fragment (``live_url_name``, ``live_template``, and what a 400 says of filters that
are not the list's, ``live_refused``), adds `live_urls` to its URLs and hands `live_src` to
its list page.

May import `cleanup.security` and `.live` (a fragment's tag); the admin's list pages import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.views.decorators.http import require_safe

from ..security import refreshes_itself
from .live import unless_unchanged

if TYPE_CHECKING:
    from django.contrib import admin

    _ModelAdminBase = admin.ModelAdmin[Any]  # mixed into model admins of several models
else:
    _ModelAdminBase = object


class LiveListMixin(_ModelAdminBase):
    """The ``live/`` fragment of a model admin's list: its rows as they are now."""

    live_url_name = ""  # the URL's name under ``admin:``, such as ``cleanup_resource_live``
    live_template = ""  # the rows alone, such as ``admin/cleanup/resource/live.html``
    live_refused = "These filters are not this list's."

    def live_urls(self) -> list[URLPattern]:
        """The fragment's URL: read, never written to; read by the page itself, so not a person's activity;
        answered 304 when what it shows did not change (`cleanup.admin.live.unless_unchanged`)."""
        view = refreshes_itself(self.admin_site.admin_view(require_safe(unless_unchanged(self.live_rows))))
        view.model_admin = self  # type: ignore[attr-defined]  # the input guard checks its query as any page's of this admin
        return [path("live/", view, name=self.live_url_name)]

    def live_src(self, request: HttpRequest) -> str:
        """Where the list page's live bar reads its rows: the fragment, with the page's query."""
        query = request.GET.urlencode()
        return reverse(f"admin:{self.live_url_name}") + (f"?{query}" if query else "")

    def live_rows(self, request: HttpRequest) -> HttpResponse:
        """The list's rows again, with the same filters and page."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            return HttpResponseBadRequest(self.live_refused)
        changelist.formset = None
        context = {"cl": changelist, "opts": self.model._meta}
        return TemplateResponse(request, self.live_template, context)
