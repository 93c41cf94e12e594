"""A recording module for the reliability suite, and the hooks that halt its process.

Installed only in the worker processes the suite starts (``tests.reliability.worker_settings``):
every call of ``rel.spawn`` and ``rel.rate`` is appended to ``RELIABILITY_CALLS`` with
its refs, pid, start and end, so the test can prove no two calls for one ref overlapped.
"""
