"""The test suite is a package so that shared helpers are imported by their path from the
repository root (`from tests.reference import lookup`, `from tests.devices import
mirrored_strategy`) instead of by editing `sys.path`. The test directories themselves are not
packages: pytest imports each test module by its own name."""
