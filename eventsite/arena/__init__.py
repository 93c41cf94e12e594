"""The ``arena`` module: bots and server cvars on OpenArena (ioquake3) servers, over rcon.

See docs/arena.md for the server's operator and `eventsite.arena.module` for the contract.
"""
