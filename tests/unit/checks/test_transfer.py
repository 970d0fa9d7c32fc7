import pytest

from graphflow.checks.transfer import TransferCheck, run_transfer_check


def test_unknown_backend_names_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="unknown backend 'carrier'; use local, ucx, mpi, ray"):
        run_transfer_check("carrier", TransferCheck())
