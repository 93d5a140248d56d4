"""The tf test layer (see tests/conftest.py)."""
