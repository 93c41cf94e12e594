"""The site as an ASGI application: what the production recipe serves (README, "Running in
production": gunicorn with uvicorn's workers). Under it the change feed's waits and event
streams are coroutines (`cleanup.api.feed.changes`), not workers, and the synchronous
parts of requests run on the process's few threads (`cleanup.serving.ASGIHandler`). Once
the site is loaded, its heap is settled (`cleanup.serving.settle_the_heap`)."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventsite.settings")
django.setup(set_prefix=False)

from django.conf import settings  # noqa: E402

from cleanup.serving import ASGIHandler, settle_the_heap  # noqa: E402  (after the settings are read)

application = ASGIHandler()
# The site is loaded: what it made lives as long as the worker, out of the collector's way.
settle_the_heap(settings.ASGI_GC_THRESHOLD)
