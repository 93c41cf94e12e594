"""The app's management commands: thin doors over the engine (`commands/`), and what they share (`base`).

May import: nothing.
"""
