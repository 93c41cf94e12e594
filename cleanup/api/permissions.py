"""Staff only, then the model permissions each view names for each method.

May import: DRF only.
"""

from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView


class StaffWithPermissions(BasePermission):
    """A staff user holding every permission in ``view.required_perms[method]``.

    An anonymous request is refused with 401 (DRF asks for credentials when no
    authenticator succeeded), a signed-in user who is not staff or lacks a permission
    with 403. HEAD is checked as GET; OPTIONS (the endpoint's description) needs staff
    only. A method the view does not list in ``required_perms`` (``PUT``, or ``LIST`` and
    ``DISPATCH``, which name attributes every view has) passes here so that DRF answers
    405: only the listed methods have handlers.
    """

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not (user and user.is_authenticated and user.is_active and user.is_staff):
            return False
        method = "GET" if request.method == "HEAD" else request.method
        perms: list[str] | None = getattr(view, "required_perms", {}).get(method)
        if method == "OPTIONS" or perms is None:
            return True
        return user.has_perms(perms)
