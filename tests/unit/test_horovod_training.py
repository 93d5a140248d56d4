"""The pure part of Horovod data-parallel training (notebook 04): the scaling efficiency
formula. The training on ipyparallel MPI engines is in tests/mpi/test_horovod_training.py."""

import pytest


def test_efficiency_formula():
    from chexnet_utils.scaling import efficiency

    assert efficiency({1: 100.0, 2: 180.0, 4: 200.0}) == {1: 1.0, 2: 0.9, 4: 0.5}
    with pytest.raises(ValueError):
        efficiency({2: 10.0})
