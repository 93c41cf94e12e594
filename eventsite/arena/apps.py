"""The arena module's app: registers its action and lease. May import: `cleanup.registry`
and the module's own parts."""

from django.apps import AppConfig


class ArenaConfig(AppConfig):
    name = "eventsite.arena"
    label = "arena"
    verbose_name = "OpenArena server module"

    def ready(self) -> None:
        from cleanup import registry

        from .module import BOTS, CVAR

        registry.register_action(BOTS)
        registry.register_lease(CVAR)
