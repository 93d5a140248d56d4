"""The test suite as a package: test files import tests.datasets and tests.proctree."""
