"""The site as an ASGI application: what the production recipe serves (README, "Running in
production": gunicorn with uvicorn's workers). Under it the change feed's waits and event
streams are coroutines (`cleanup.api.feed.changes`), not workers, and the synchronous
parts of requests run on the process's few threads (`cleanup.serving.ASGIHandler`)."""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventsite.settings")
django.setup(set_prefix=False)

from cleanup.serving import ASGIHandler  # noqa: E402  (after the settings are read)

application = ASGIHandler()
