"""The admin's page of API tokens: each shown by its prefix, its user and when it expires.

The token itself is nowhere to show (only its digest is stored, `cleanup.api.tokens`):
a token is made by ``manage.py create_token``, not here, and never edited. Deleting one
revokes it; only a superuser, or a user given knox's ``delete_authtoken``, may.

May import: `cleanup.api.tokens` (and knox); imported by the admin package.
"""

from typing import TYPE_CHECKING, Any

import knox.admin  # noqa: F401  (knox's own page, registered first and replaced here)
from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone
from knox.models import AuthToken

from ..api.tokens import prefix

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]  # knox's AuthToken has no types
else:
    _ModelAdmin = admin.ModelAdmin


class TokenAdmin(_ModelAdmin):
    list_display = ("token_prefix", "user", "created", "expiry", "expired")
    list_select_related = ("user",)
    search_fields = ("token_key", "user__username")
    fields = ("token_prefix", "user", "created", "expiry")
    readonly_fields = fields
    ordering = ("-created",)

    @admin.display(description="token")
    def token_prefix(self, obj: Any) -> str:
        return prefix(obj)

    @admin.display(description="expired", boolean=True)
    def expired(self, obj: Any) -> bool:
        return obj.expiry is not None and bool(obj.expiry <= timezone.now())

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return user.is_active and (user.is_superuser or super().has_delete_permission(request, obj))


if admin.site.is_registered(AuthToken):
    admin.site.unregister(AuthToken)
admin.site.register(AuthToken, TokenAdmin)
