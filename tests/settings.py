"""Test settings: the site's own settings, with django-q2 run in-process.

django-q2 reads its configuration once, at import, so `override_settings(Q_CLUSTER=...)`
cannot switch it; the test run starts with `sync` on instead, and a queued task runs in
the caller (its exception reaching the test).
"""

import os

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("SECRET_KEY", "tests-only-secret-key-not-for-deployment-0123456789")

from eventsite.settings import *  # noqa: E402,F403
from eventsite.settings import DATABASES, Q_CLUSTER  # noqa: E402

Q_CLUSTER = {**Q_CLUSTER, "sync": True}

# One test database per test process, so that two test runs on one server (a developer's
# and CI's) never share one.
_db = DATABASES["default"]
_db["TEST"] = {"NAME": f"test_{_db['NAME']}_{os.getpid()}"}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The suite makes many requests as one user in a few seconds (schemathesis, the access
# tests): its throttles are far off, and the throttle tests set their own rates.
REST_FRAMEWORK = {
    **REST_FRAMEWORK,  # noqa: F405
    "DEFAULT_THROTTLE_RATES": {scope: "100000/min" for scope in API_THROTTLE_RATES},  # noqa: F405
}
