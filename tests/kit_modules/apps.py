from django.apps import AppConfig


class KitModulesConfig(AppConfig):
    name = "tests.kit_modules"
    label = "kit_modules"

    def ready(self):
        from cleanup import registry

        from .module import ACTIONS, LEASES

        for action in ACTIONS:
            registry.register_action(action)
        for lease in LEASES:
            registry.register_lease(lease)
