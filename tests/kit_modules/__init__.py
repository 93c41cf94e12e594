"""Modules for the conformance kit's tests: one honest, the others each breaking one rule.

Each is the sandbox module with one thing done wrong, so the kit meets it against a real
shard. It is also a Django app (``tests.kit_modules``) that a test installs from outside
the site with ``EVENT_MODULES``.
"""
