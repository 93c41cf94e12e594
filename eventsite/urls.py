from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from cleanup.health import healthz

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="admin:index")),
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/events/", include("cleanup.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]

handler404 = "cleanup.api.views.not_found"
handler500 = "cleanup.api.views.server_error"
