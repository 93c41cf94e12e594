"""The site as an ASGI application: what the production recipe serves (README, "Running in
production": gunicorn with uvicorn's workers). Under it the change feed's waits and event
streams are coroutines (`cleanup.api.feed.changes`), not workers."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventsite.settings")

application = get_asgi_application()
