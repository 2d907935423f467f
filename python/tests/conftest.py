# Fixtures shared by the pytest files of python/tests.
import pytest


@pytest.fixture
def one_process(tmp_path):
    """A one-rank Gloo process group (torch.distributed) for the test, destroyed after it."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()
