import pytest


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance for the whole test session (2 CPUs, no dashboard)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
