"""The events API, included by the site under ``/api/v1/events/`` (`urlpatterns`), and under
the deprecated ``/api/events/`` (`legacy_urlpatterns`: the same views, without names, so that
``reverse`` always answers the v1 URL; `cleanup.api.errors.ApiErrorsMiddleware` marks those
answers deprecated).

May import: the API's views (`views`, `module_views`, `feed`).
"""

from django.urls import path

from . import feed, module_views, schema, views  # noqa: F401 (schema: its extension registers)

urlpatterns = [
    path("runs/", views.RunListView.as_view(), name="events-runs"),
    path("runs/<int:pk>/", views.RunDetailView.as_view(), name="events-run"),
    path("runs/<int:pk>/cancel/", views.RunCancelView.as_view(), name="events-run-cancel"),
    path("runs/<int:pk>/cleanup/", views.RunCleanupView.as_view(), name="events-run-cleanup"),
    path("runs/<int:pk>/waive/", views.RunWaiveView.as_view(), name="events-run-waive"),
    path("runs/<int:pk>/cleanup-plan/", views.RunCleanupPlanView.as_view(), name="events-run-cleanup-plan"),
    path("runs/<int:pk>/resources/", views.RunResourcesView.as_view(), name="events-run-resources"),
    path("runs/<int:pk>/log/", views.RunLogView.as_view(), name="events-run-log"),
    path("resources/", views.ResourceListView.as_view(), name="events-resources"),
    path("resources/<int:pk>/", views.ResourceDetailView.as_view(), name="events-resource"),
    path("resources/<int:pk>/waive/", views.ResourceWaiveView.as_view(), name="events-resource-waive"),
    path("modules/", module_views.ModuleListView.as_view(), name="events-modules"),
    path("modules/log/", module_views.ModuleLogView.as_view(), name="events-modules-log"),
    path("modules/<str:name>/down/", module_views.ModuleDownView.as_view(), name="events-module-down"),
    path("modules/<str:name>/up/", module_views.ModuleUpView.as_view(), name="events-module-up"),
    path("modules/<str:name>/log/", module_views.ModuleOneLogView.as_view(), name="events-module-log"),
    path("modules/<str:name>/reconcile/", views.ModuleReconcileView.as_view(), name="events-module-reconcile"),
    path(
        "modules/<str:name>/backends/<str:backend>/down/",
        module_views.BackendDownView.as_view(),
        name="events-backend-down",
    ),
    path(
        "modules/<str:name>/backends/<str:backend>/up/", module_views.BackendUpView.as_view(), name="events-backend-up"
    ),
    path(
        "modules/<str:name>/backends/<str:backend>/reconcile/",
        views.BackendReconcileView.as_view(),
        name="events-backend-reconcile",
    ),
    path("summary/", views.SummaryView.as_view(), name="events-summary"),
    path("changes/", feed.changes, name="events-changes"),
]

legacy_urlpatterns = [path(str(p.pattern), p.callback) for p in urlpatterns]
