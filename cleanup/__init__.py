"""Ledger-driven cleanup for live game events.

Everything an event run takes from the world is written to the ledger
(`cleanup.models.Resource`); when the run ends, the sweep (`cleanup.sweep`) gives it
back. Modules plug in through `cleanup.registry`.
May import: nothing; Django loads the app through `cleanup.apps`.
"""
