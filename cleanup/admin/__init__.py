"""The admin: what needs a person first, runs, the ledger, the modules and the log, read-only.

Importing the package registers every page (Django's admin autodiscovery does).
"""

from . import modules, runs  # noqa: F401  (each registers its pages)
