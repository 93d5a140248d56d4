"""The mpi test layer (see tests/conftest.py)."""
