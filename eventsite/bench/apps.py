from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "eventsite.bench"
    label = "bench"
    verbose_name = "Benchmark of the sweep"
