from django.contrib import admin
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from cleanup.api.urls import legacy_urlpatterns
from cleanup.metrics import metrics
from cleanup.sitecheck import healthz

# The root only points at the admin: GET and HEAD, and 405 (with Allow) for any other
# method rather than a redirect or the CSRF check's 403, since nothing here acts on one.
root = csrf_exempt(RedirectView.as_view(pattern_name="admin:index", http_method_names=["get", "head"]))
# The docs page answers GET and HEAD: drf-spectacular answers its OPTIONS by rendering an
# HTML template it has no name for, a 500. Its start script is a file of its own
# (`?script`), not inline, so the page works under the site's Content-Security-Policy.
docs = SpectacularSwaggerSplitView.as_view(url_name="schema", http_method_names=["get", "head"])

urlpatterns = [
    path("", root),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/events/", include("cleanup.urls")),
    # The old prefix answers the same, marked deprecated (Deprecation, Link: successor-version).
    path("api/events/", include(legacy_urlpatterns)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", docs, name="api-docs"),
]

handler404 = "cleanup.api.views.not_found"
handler500 = "cleanup.api.views.server_error"
