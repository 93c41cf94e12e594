from django.apps import AppConfig


class SandboxConfig(AppConfig):
    name = "eventsite.sandbox"
    label = "sandbox"
    verbose_name = "Sandbox shard module"

    def ready(self):
        from cleanup import registry

        from .module import SPAWN, SPAWNER_RATE

        registry.register_action(SPAWN)
        registry.register_lease(SPAWNER_RATE)
