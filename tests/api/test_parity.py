"""Temporary re-export: the parity tests moved to `test_*_parity.py` (and their helpers to
`parity_helpers.py`), but `test_errors.py` still imports these names from here. Delete this file
once its import reads `from tests.api.parity_helpers import ...`."""
from tests.api.parity_helpers import (  # noqa: F401  pylint: disable=unused-import
    FEATURES, TABLES, Trainer, loss_of, make_optimizer, random_steps, skip_without_devices)
