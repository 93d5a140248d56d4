"""The unit test layer (see tests/conftest.py)."""
