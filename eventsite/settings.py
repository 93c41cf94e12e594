"""Settings for the example site, read from the environment (docs/settings.md lists them).
Imports the standard library, dj-database-url and Django's exceptions, `cleanup.conf`
for the names of the engine's settings (their defaults live there, not here), and
`eventsite.sandbox.fleet` and `eventsite.arena.servers` (standard library only) to read
``SANDBOX_SHARDS`` and ``ARENA_SERVERS``.

Every value a deployment changes comes from an environment variable of the same name.
The helpers below refuse values they cannot read, naming the variable, rather than
falling back to a default that would hide a typo.
"""

import os
import re
import tomllib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from cleanup import conf as engine_conf
from eventsite.arena.servers import BadServers, parse_servers
from eventsite.sandbox.fleet import BadShards, parse_shards

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("EVENTSITE_VAR_DIR", BASE_DIR / "var"))

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_bool(name, default):
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no")


def env_int(name, default):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a whole number") from None


def env_float(name, default, low, high):
    """A number from ``low`` to ``high``, such as ``0.1`` or ``2``."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if not low <= value <= high:  # also refuses nan
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number from {low:g} to {high:g}")
    return value


def env_list(name, default):
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set. Set it in the environment (DEBUG=1 allows a throwaway key for local work)."
        )
    SECRET_KEY = "insecure-local-only-" + "x" * 40

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])


def env_proxy_header(name):
    """``HEADER,value``, such as ``HTTP_X_FORWARDED_PROTO,https``: the header a proxy sets
    to say the request came over HTTPS. Unset means no proxy is trusted."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    header, _, value = (part.strip() for part in raw.partition(","))
    if not header.startswith("HTTP_") or not value:
        raise ImproperlyConfigured(f"{name}={raw!r} is not HEADER,value such as HTTP_X_FORWARDED_PROTO,https")
    return (header, value)


# HTTPS, for a site behind TLS. Each is off unless set: a site without TLS would lock
# itself out with them (README, "Running in production").
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# A load balancer probes /healthz over plain HTTP, inside the network.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_PROXY_SSL_HEADER = env_proxy_header("SECURE_PROXY_SSL_HEADER")
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    # API tokens, stored hashed, expiring (cleanup.api.tokens); the lockout of guessed
    # passwords (cleanup.admin.lockout); the Content-Security-Policy header.
    "knox",
    "axes",
    "csp",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "cleanup",
    "eventsite.sandbox",
    "eventsite.luanti",
    "eventsite.arena",
    "eventsite.bench",
]

# Modules from outside the repository: their Django apps, installed by setting
# alone, e.g. EVENT_MODULES=mygame.events,othergame.module. A path that cannot be an app is
# refused here, naming it, rather than as an import error later.
EVENT_MODULES = env_list("EVENT_MODULES", [])
for _app in EVENT_MODULES:
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", _app):
        raise ImproperlyConfigured(f"EVENT_MODULES: {_app!r} is not a dotted Python path of an app")
INSTALLED_APPS += [app for app in EVENT_MODULES if app not in INSTALLED_APPS]

MIDDLEWARE = [
    # Django's and django-csp's middleware are served under ASGI by cleanup.serving's
    # counterparts (its ASGIHandler builds the chain), whose hooks run on the event loop.
    "django.middleware.security.SecurityMiddleware",
    # A path with a NUL or another control character is a 404 before any view sees it.
    "cleanup.security.RefuseControlCharacterPaths",
    "csp.middleware.CSPMiddleware",
    # WhiteNoise's, passing every other request on to an async handler as it is (ASGI).
    "eventsite.static.StaticFiles",
    # Before anything reads the body or answers HTML under /api/.
    "cleanup.api.errors.ApiErrorsMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # A session left alone longer than SESSION_IDLE_TIMEOUT is logged out.
    "cleanup.security.IdleSessionTimeout",
    "django.contrib.messages.middleware.MessageMiddleware",
    "cleanup.admin.guards.AdminInputGuard",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # API answers are never stored by a browser or a proxy.
    "cleanup.security.NoStoreForApi",
    # Each API user's standing against the throttle (cleanup.api.throttles), on every answer.
    "cleanup.security.RateLimitHeaders",
    # Last: it answers a locked-out login (cleanup.admin.lockout).
    "axes.middleware.AxesMiddleware",
]

# Logins: django-axes counts failures per (username, client address) and refuses that
# username from that address for EVENT_LOGIN_COOLOFF_S even with the right password, so
# nobody locks a username (the superuser's) out from elsewhere; its handler also refuses
# an address past EVENT_LOGIN_ADDRESS_FAILURE_LIMIT failures whatever the usernames
# (cleanup.admin.lockout). Its backend comes first.
AUTHENTICATION_BACKENDS = [
    "cleanup.admin.lockout.LockoutBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_HANDLER = "cleanup.admin.lockout.LockoutHandler"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_FAILURE_LIMIT = "cleanup.admin.lockout.failure_limit"
AXES_COOLOFF_TIME = "cleanup.admin.lockout.cooloff"
AXES_LOCKOUT_CALLABLE = "cleanup.admin.lockout.lockout_response"
AXES_RESET_ON_SUCCESS = True
AXES_ENABLE_ACCESS_FAILURE_LOG = True
# Behind the README's one proxy the client's address is the last X-Forwarded-For entry.
NUM_PROXIES = env_int("NUM_PROXIES", 0)
AXES_IPWARE_PROXY_COUNT = NUM_PROXIES or None
AXES_IPWARE_META_PRECEDENCE_ORDER = ["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"] if NUM_PROXIES else ["REMOTE_ADDR"]

# Sessions last SESSION_COOKIE_AGE (8 hours) at most, and SESSION_IDLE_TIMEOUT (1 hour)
# without a request.
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 8 * 3600)
SESSION_IDLE_TIMEOUT = env_int("SESSION_IDLE_TIMEOUT", 3600)

# Every page's Content-Security-Policy: scripts from the site itself only, never inline
# (the admin needs none; the API's docs page loads its start script as a file of its own),
# nothing framed, no plugins, forms posted only to the site. Styles may be inline as well
# (the admin's pages and Swagger UI set style attributes): a style runs no code.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

ROOT_URLCONF = "eventsite.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The site's own templates: the admin's branding, the login page, the 404 and 500
        # pages; the reusable app keeps its own under cleanup/templates/.
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "eventsite.wsgi.application"
# What the production recipe serves (README, "Running in production").
ASGI_APPLICATION = "eventsite.asgi.application"
# Threads per ASGI worker process for the synchronous parts of requests (views, sessions):
# at most this many run at once (cleanup.serving.RequestThreads).
ASGI_THREADS = env_int("ASGI_THREADS", 8)
if ASGI_THREADS < 1:
    raise ImproperlyConfigured(f"ASGI_THREADS={ASGI_THREADS} is below 1")
# Allocations between two of the garbage collector's passes over the youngest objects in an
# ASGI worker, whose start-up objects are kept out of every pass (cleanup.serving.
# settle_the_heap); Python's own is 700. 0 leaves the collector as Python sets it.
ASGI_GC_THRESHOLD = env_int("ASGI_GC_THRESHOLD", 20000)
if ASGI_GC_THRESHOLD < 0:
    raise ImproperlyConfigured(f"ASGI_GC_THRESHOLD={ASGI_GC_THRESHOLD} is below 0")


# The app runs on PostgreSQL only (the system check cleanup.E020 refuses any other engine).
# Unset, DATABASE_URL is the local PostgreSQL; `make test` and `make demo` set it to the
# database they pick or start (eventsite/localdb).
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/eventsite"


def _database():
    url = os.environ.get("DATABASE_URL", "").strip() or DEFAULT_DATABASE_URL
    # DATABASE_POOL_MAX_SIZE: each process keeps a pool of at most this many connections,
    # taken by a request for its queries and given back when it ends (what the ASGI recipe
    # uses: an ASGI request's thread lives only as long as the request). Unset, each thread
    # keeps its own connection for CONN_MAX_AGE (60 s).
    pool = env_int("DATABASE_POOL_MAX_SIZE", 0)
    if pool < 0:
        raise ImproperlyConfigured(f"DATABASE_POOL_MAX_SIZE={pool} is below 0")
    try:
        if pool:
            config = dj_database_url.parse(url, conn_max_age=0)
        else:
            config = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
    except (ValueError, dj_database_url.UnknownSchemeError) as exc:
        raise ImproperlyConfigured(f"DATABASE_URL cannot be read: {exc}") from None
    if pool:
        # A request waits up to 30 s for a connection of the pool (a burst queues), then fails
        # (a 500) rather than queueing for ever.
        config.setdefault("OPTIONS", {})["pool"] = {"min_size": 1, "max_size": pool, "timeout": 30}
    # Behind PgBouncer in transaction mode a connection's server changes between
    # transactions: no server-side cursors, and no prepared statements for the finder.
    if env_bool("DATABASE_TRANSACTION_POOLER", False):
        config["DISABLE_SERVER_SIDE_CURSORS"] = True
    return config


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", VAR_DIR / "static"))
# WhiteNoise serves STATIC_ROOT (filled by `manage.py collectstatic`) from the WSGI app,
# compressed; no manifest, so a page renders the same before and after collectstatic.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# Mail. Staff are told when a run's cleanup gives up, and when it later completes
# (cleanup.alerts), by mail to ADMINS ("Name <address>" items, comma-separated) through the
# SMTP server below, and by a JSON POST to EVENT_ALERT_WEBHOOK_URL when it is set. A request
# that fails is mailed to ADMINS too, but only when EMAIL_HOST is set in the environment:
# unset, it is localhost for the alerts, and a failing request is only logged.
ADMINS = [
    (item.partition("<")[0].strip() or item.strip(), item.partition("<")[2].rstrip(">").strip() or item.strip())
    for item in env_list("ADMINS", [])
]
EMAIL_BACKEND = os.environ.get("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10)
SERVER_EMAIL = os.environ.get("SERVER_EMAIL", "eventsite@localhost")
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", SERVER_EMAIL)
EMAIL_SUBJECT_PREFIX = os.environ.get("EMAIL_SUBJECT_PREFIX", "[eventsite] ")
MAIL_CONFIGURED = bool(os.environ.get("EMAIL_HOST") and ADMINS)

# A request that fails is logged with its traceback on standard error (where gunicorn and
# systemd collect it), and, when mail is configured, mailed to ADMINS by the cluster (the
# request only queues it: cleanup.errormail), once per distinct error per
# EVENT_ERROR_MAIL_INTERVAL_S. A request with a Host not in ALLOWED_HOSTS is logged, never
# mailed: anyone can send one. Django's own loggers are set here, so its default mail
# handler (sent inside the request) is never used.
# LOG_FORMAT=json: one JSON object per line on standard error (time, level, logger,
# message, and the run, module, backend and task a line is about where known); plain
# text by default.
LOG_FORMAT = os.environ.get("LOG_FORMAT", "plain").strip().lower() or "plain"
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be plain or json, not {LOG_FORMAT!r}")


def logging_config(mail, log_format="plain"):
    """The site's logging; ``mail``: failures are mailed too (tests/security/test_mail.py)."""
    to_mail = ["mail_admins"] if mail else []
    level = os.environ.get("LOG_LEVEL", "INFO")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
            "json": {"()": "cleanup.logs.JsonFormatter"},
        },
        "filters": {"context": {"()": "cleanup.logs.ContextFilter"}},
        "handlers": {
            "console": {"class": "logging.StreamHandler", "formatter": log_format, "filters": ["context"]},
            "mail_admins": {"class": "cleanup.errormail.QueuedAdminEmailHandler", "level": "ERROR"},
        },
        "loggers": {
            "cleanup": {"handlers": ["console"], "level": level},
            "eventsite": {"handlers": ["console"], "level": level},
            # django-q2 adds a handler of its own only to a logger that has none.
            "django-q": {"handlers": ["console"], "level": level, "propagate": False},
            # Failed logins and lockouts (django-axes).
            "axes": {"handlers": ["console"], "level": "WARNING", "propagate": False},
            "django": {"handlers": ["console", *to_mail], "level": "WARNING", "propagate": False},
            "django.request": {"handlers": ["console", *to_mail], "level": "ERROR", "propagate": False},
            "django.security.DisallowedHost": {"handlers": ["console"], "level": "ERROR", "propagate": False},
            "django.server": {"handlers": ["console"], "level": "INFO", "propagate": False},
        },
    }


LOGGING = logging_config(MAIL_CONFIGURED, LOG_FORMAT)


def env_rate(name, default):
    """A DRF throttle rate ("120/min": a number, "/", then s, min, hour or day) from the
    environment; "off" (or empty) for no limit."""
    value = os.environ.get(name, default).strip()
    if value.lower() in ("", "off", "none"):
        return None
    number, _, period = value.partition("/")
    if not (number.isdecimal() and int(number) > 0 and period[:1] in ("s", "m", "h", "d")):
        raise ImproperlyConfigured(f'{name} must be a rate such as "120/min" (per s, min, hour or day), or "off"')
    return value


# Per user, per scope (cleanup.api.throttles): reads, writes (start, cancel), and a person's
# actions (cleanup, waive, reconcile, mark down or up), which each make work for the shards.
API_THROTTLE_RATES = {
    "events_reads": env_rate("API_THROTTLE_READS", "1200/min"),
    "events_writes": env_rate("API_THROTTLE_WRITES", "120/min"),
    "events_actions": env_rate("API_THROTTLE_ACTIONS", "30/min"),
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "cleanup.api.tokens.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PARSER_CLASSES": ["cleanup.api.parsers.BoundedJSONParser"],
    "EXCEPTION_HANDLER": "cleanup.api.errors.exception_handler",
    "DEFAULT_THROTTLE_RATES": API_THROTTLE_RATES,
    "NUM_PROXIES": NUM_PROXIES,
}


def _package_version():
    """The installed package's version; from pyproject.toml when the source runs uninstalled."""
    try:
        return package_version("eventsite")
    except PackageNotFoundError:
        return tomllib.loads((BASE_DIR / "pyproject.toml").read_text())["project"]["version"]


SPECTACULAR_SETTINGS = {
    "TITLE": "eventsite events API",
    "DESCRIPTION": "Event runs, their ledger, and the cleanup that gives it back.",
    # The package's version (pyproject.toml), as a console reads it in info.version.
    "VERSION": _package_version(),
    # The schema and its docs page are for staff, like the API; the page's scripts come
    # from the installed drf-spectacular-sidecar, not a CDN, so it works offline.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAdminUser"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Only /api/v1/events/: the deprecated /api/events/ answers the same, undocumented.
    "PREPROCESSING_HOOKS": ["cleanup.api.schema.only_current_version"],
    # Operation ids as before the version: events_runs_list, not v1_events_runs_list.
    "SCHEMA_PATH_PREFIX": r"/api/v1/",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "cleanup.api.schema.refuse_unknown_fields",
        "cleanup.api.schema.state_the_checks",
        "cleanup.api.schema.document_conditionals",
        "cleanup.api.schema.declare_errors",
        "cleanup.api.idempotency.document_idempotency_key",
        "cleanup.api.throttles.document_throttles",
    ],
    # Run.status and Step.status are both "status": name each choice set once.
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "cleanup.models.RunStatus",
        "CleanupStatusEnum": "cleanup.models.CleanupStatus",
        "StepStatusEnum": "cleanup.models.StepStatus",
        "ResourceStateEnum": "cleanup.models.ResourceState",
        "ModuleStateEnum": "cleanup.models.ModuleState",
        "ErrorCodeEnum": "cleanup.api.errors.CODE_CHOICES",
    },
}

# The engine (cleanup.conf): each of its settings, and each deprecated old name, is read
# from the environment variable of that name when it is set. Unset, the Django setting stays
# unset and the engine uses the default in cleanup.conf's table, where each is read at the
# moment of use (so override_settings works) and checked by the system checks.
_ENGINE_READERS = {
    engine_conf.INT: lambda name: env_int(name, None),
    engine_conf.URL: os.environ.get,
    engine_conf.TEXT: os.environ.get,
}
for _entry in engine_conf.SETTINGS:
    for _name in _entry.names:
        _value = _ENGINE_READERS[_entry.kind](_name)
        if _value is not None:
            globals()[_name] = _value

# The site's metrics are named after it (eventsite_ledger_rows, ...) unless set otherwise.
EVENT_METRICS_NAMESPACE = os.environ.get("EVENT_METRICS_NAMESPACE", "eventsite")

# django-q2: on Redis when REDIS_URL is set, so that several worker machines share one
# queue; on the ORM broker (the database, nothing more to run) otherwise. A task is handed
# out again when it is not acknowledged within `retry` seconds (ORM broker only; Redis
# hands a task out once), so `timeout` stays well below it; a failing task is
# acknowledged and tried at most `max_attempts` times instead of for ever. The ledger's
# own claims, not the broker, are what keep two workers off one row, and the schedule
# (one tick a minute, locked in the database) is the backstop for a task the broker lost.
# An idle ORM broker looks for a task every `poll` seconds (one query each time), which is
# how long a run that ended may wait before its cleanup starts; Redis wakes at once.
REDIS_URL = os.environ.get("REDIS_URL", "").strip()
if REDIS_URL and not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
    raise ImproperlyConfigured(f"REDIS_URL={REDIS_URL!r} is not a redis://, rediss:// or unix:// URL")

Q_CLUSTER = {
    # Every machine of one site uses the same name: it is the queue's key on Redis and
    # the salt that signs the tasks.
    "name": os.environ.get("Q_NAME", "eventsite"),
    "workers": env_int("Q_WORKERS", 2),
    "timeout": env_int("Q_TIMEOUT", 600),
    "retry": env_int("Q_RETRY", 900),
    "max_attempts": 3,
    "ack_failures": True,
    "catch_up": False,
    # Results kept per task function, so a burst of cleanup tasks cannot push out the
    # last tick's result, which /healthz reads.
    "save_limit": 500,
    "save_limit_per": "func",
    "poll": env_float("Q_POLL", 0.1, low=0.01, high=60),
    "sync": env_bool("Q_SYNC", False),
    # django-q2 reads `redis` as a URL (redis.from_url) or as keyword arguments.
    **({"redis": REDIS_URL} if REDIS_URL else {"orm": "default"}),
}

# The counters every process of the site shares (`cleanup.conf.COUNTERS_CACHE`): the API's
# throttles, the failed-token lockout and the error mail's bound. On Redis when REDIS_URL
# is set; else in the database (the table the app's migration 0031 makes), never in one
# process's memory, where each worker would count apart (`check --deploy` warns,
# cleanup.W031). Nothing else of the site uses a cache.
COUNTERS_CACHE = (
    {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": f"{Q_CLUSTER['name']}:counters",
        # One connection pool per process (cleanup.limits.SharedRedisPool), not per request.
        "OPTIONS": {
            "pool_class": "cleanup.limits.SharedRedisPool",
            "socket_timeout": 0.5,
            "socket_connect_timeout": 0.5,
        },
    }
    if REDIS_URL
    # Django's database cache, each write one upsert (cleanup.limits.CountersCache).
    else {"BACKEND": "cleanup.limits.CountersCache", "LOCATION": "cleanup_counters"}
)
CACHES = {"default": COUNTERS_CACHE, "counters": COUNTERS_CACHE}

# The sandbox module's shards: SANDBOX_SHARDS, "name=url" pairs separated by commas
# (north=http://127.0.0.1:7777,south=http://127.0.0.1:7778), each name a backend of the
# module; when it is empty, a fleet of one, the shard at SANDBOX_SHARD_URL (backend "").
SANDBOX_SHARD_URL = os.environ.get("SANDBOX_SHARD_URL", "http://127.0.0.1:7777")
try:
    SANDBOX_SHARDS = parse_shards(os.environ.get("SANDBOX_SHARDS", ""))
except BadShards as exc:
    raise ImproperlyConfigured(f"SANDBOX_SHARDS: {exc}") from None
# Each request the sandbox module makes (connect, send and read, each).
SANDBOX_SHARD_TIMEOUT_MS = env_int("SANDBOX_SHARD_TIMEOUT_MS", 3000)

# The Luanti module (eventsite/luanti, docs/luanti.md): the world directory of each server,
# `name=world_dir` pairs, comma-separated (a lone bare world_dir is the backend "").
LUANTI_WORLDS = os.environ.get("LUANTI_WORLDS", "")
LUANTI_TIMEOUT_MS = env_int("LUANTI_TIMEOUT_MS", 10000)
LUANTI_HEARTBEAT_STALE_S = env_float("LUANTI_HEARTBEAT_STALE_S", 5.0, 1.0, 3600.0)

# The arena module (eventsite/arena, docs/arena.md): OpenArena servers over rcon,
# `name=host:port` pairs, comma-separated (a lone bare host:port is the backend "").
try:
    ARENA_SERVERS = os.environ.get("ARENA_SERVERS", "")
    parse_servers(ARENA_SERVERS)
except BadServers as exc:
    raise ImproperlyConfigured(f"ARENA_SERVERS: {exc}") from None
ARENA_RCON_PASSWORD = os.environ.get("ARENA_RCON_PASSWORD", "")
ARENA_TIMEOUT_MS = env_int("ARENA_TIMEOUT_MS", 2000)
