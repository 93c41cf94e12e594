"""The admin: what needs a person first, runs, the ledger, the modules and the log, read-only.

Nothing here edits a row: every change goes through an action, confirmed on a page of
its own, which calls the engine and records who asked, in the run log and in the
admin's recent actions. Lists never count, facet or DISTINCT a whole table: counts are
capped, filters have fixed choices, and the queries behind "needs attention" read the
partial indexes of unresolved rows only.

One module per surface: `runs` (a run's page, its actions, its steps and log),
`resources` (the ledger), `modules` (module health and the modules' log), `alerts` (the
outbox); `lists` holds what they share, `live` the fragments that keep the index, a run's
page and the ledger current (read again by ``cleanup/static/cleanup/live.js``),
`summaries` what a row is and what a run holds in words, `logtext` the run log in
sentences, and `guards` the middleware that keeps malformed input from them. Importing
the package registers every page; nothing imports it but Django's admin autodiscovery,
the template tags (`lists`, `live`) and the settings (`guards`).
May import: the engine's entry points (`manual`, `runner`, `plan`, `outages`, `sweep`), the
models, conf, `validation`, `timeline`, `calls` (a backend's name), `security` (what a live
fragment is to the idle clock); nothing of the engine
imports it.
"""

from django.apps import apps
from django.contrib import admin

from . import alerts, djangoq, modules, resources, runs, tokens  # noqa: F401  (each registers its pages)

# The lockout's pages are the project's when it installs django-axes (the example site does).
if apps.is_installed("axes"):
    from . import lockout  # noqa: F401

# Lists need the width more than a second menu of the models the index already lists.
admin.site.enable_nav_sidebar = False
# The index leads with what needs a person. A project that set its own index keeps it
# (and can include "admin/cleanup/attention.html" in it).
if admin.site.index_template is None:
    admin.site.index_template = "admin/cleanup/index.html"
