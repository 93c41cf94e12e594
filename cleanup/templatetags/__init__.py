"""Template tags of the admin.

May import: nothing.
"""
