"""One module per command; each is a few lines over the engine.

May import: nothing.
"""
