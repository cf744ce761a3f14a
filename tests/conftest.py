"""Root conftest: runs before pytest collects any test, so the logical CPU devices are configured
before TensorFlow initializes its runtime (tests/devices.py). Tests that need more replicas than
could be configured skip themselves (`tests.devices.require_replicas`)."""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from tests import devices  # noqa: E402

devices.configure()


@pytest.fixture(autouse=True)
def _fresh_collective_keys():
    """Leaves a fresh collective key base behind every test for whatever strategy is created
    next, in this test file or a later one."""
    yield
    devices.fresh_collective_keys()


def pytest_collection_modifyitems(config, items):   # pylint: disable=unused-argument
    """Tests marked `oneccl` skip themselves when the oneCCL extra is not installed."""
    from tf_sc_embedding.collectives import oneccl_library  # pylint: disable=import-outside-toplevel
    if oneccl_library.is_installed():
        return
    skip = pytest.mark.skip(reason="needs the oneCCL extra (pip install .[oneccl], or "
                                   "SCE_ONECCL=1 bash scripts/setup.sh)")
    for item in items:
        if "oneccl" in item.keywords:
            item.add_marker(skip)
