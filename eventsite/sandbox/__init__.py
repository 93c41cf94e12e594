"""The sandbox: a stand-in game shard (`shard`) and the module that talks to it.

`eventsite.sandbox.shard` runs without Django (``python -m eventsite.sandbox.shard``);
`eventsite.sandbox.module` is the example module every module author can copy: its
actions and lease are registered with `cleanup.registry` when the app is ready.
"""
