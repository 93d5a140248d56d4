"""The test suite as a package: test files import what they share from ``tests.support``."""
