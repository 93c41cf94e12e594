"""The Luanti module's app: registers its action and leases. May import: `cleanup.registry`
and the module's own parts."""

from django.apps import AppConfig


class LuantiConfig(AppConfig):
    name = "eventsite.luanti"
    label = "luanti"
    verbose_name = "Luanti server module"

    def ready(self) -> None:
        from cleanup import registry

        from .module import SPAWN, SPAWN_RATE, TIME_SPEED

        registry.register_action(SPAWN)
        registry.register_lease(TIME_SPEED)
        registry.register_lease(SPAWN_RATE)
