"""The notebooks test layer (see tests/conftest.py)."""
