from tests.reliability.harness import workers  # noqa: F401  (the fixture)
