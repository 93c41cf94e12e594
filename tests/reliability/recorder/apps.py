from django.apps import AppConfig


class RecorderConfig(AppConfig):
    name = "tests.reliability.recorder"
    label = "reliability_recorder"

    def ready(self):
        from cleanup import registry

        from . import halt, module

        registry.register_action(module.Spawn())
        registry.register_lease(module.Rate())
        halt.install_from_environment()
