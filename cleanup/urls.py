"""The app's URLs: the events API, under whatever prefix a project includes them at.

    path("api/v1/events/", include("cleanup.urls"))

The admin's pages come with the project's ``admin.site.urls``; ``/metrics`` and the
site's probe are views a project routes where it likes (`cleanup.metrics.metrics`,
`cleanup.sitecheck.healthz`). See docs/install.md.
May import: the API's URLs.
"""

from django.urls import include, path

urlpatterns = [
    path("", include("cleanup.api.urls")),
]
