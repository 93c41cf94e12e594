"""Test settings: the site's own settings, with django-q2 run in-process.

django-q2 reads its configuration once, at import, so `override_settings(Q_CLUSTER=...)`
cannot switch it; the test run starts with `sync` on instead, and a queued task runs in
the caller (its exception reaching the test).
"""

import os

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("SECRET_KEY", "tests-only-secret-key-not-for-deployment-0123456789")

from eventsite.settings import *  # noqa: E402,F403
from eventsite.settings import Q_CLUSTER  # noqa: E402

Q_CLUSTER = {**Q_CLUSTER, "sync": True}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
