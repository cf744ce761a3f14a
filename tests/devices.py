"""Logical CPU devices and MirroredStrategy collective keys: the one home of the rules every test
that runs MirroredStrategy in one process needs.

* The physical CPU is split into NUM_LOGICAL_CPUS logical devices so MirroredStrategy can run
  1-8 replicas in one test process. This only works before TensorFlow initializes its runtime,
  so tests/conftest.py calls `configure()` when pytest loads it (before collecting any test), and
  subprocess entry points call it first thing.
* Strategies with different device counts in one process must not share collective group keys
  (TensorFlow's own strategy_combinations bumps the same base): `mirrored_strategy()` leaves a
  fresh key base before creating a strategy, and the autouse fixture of tests/conftest.py does
  so after every test.
"""
import tensorflow as tf

NUM_LOGICAL_CPUS = 8
_COLLECTIVE_KEY_STEP = 100000


def configure():
    """Configures the logical CPUs (if still possible) and returns how many exist."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)
    except RuntimeError:  # the runtime is already initialized
        pass
    return len(tf.config.list_logical_devices("CPU"))


def require_replicas(*counts):
    """Skips the calling test when fewer logical CPUs than any of `counts` are configured
    (TensorFlow was initialized before tests/conftest.py could configure them)."""
    import pytest  # pylint: disable=import-outside-toplevel
    available = len(tf.config.list_logical_devices("CPU"))
    for n in counts:
        if n > available:
            pytest.skip(f"needs {n} logical CPU devices, only {available} are configured")


def fresh_collective_keys():
    """Moves MirroredStrategy's collective key base past every key handed out so far."""
    tf.distribute.MirroredStrategy._collective_key_base += _COLLECTIVE_KEY_STEP  # pylint: disable=protected-access


def mirrored_strategy(replicas):
    """A MirroredStrategy over the first `replicas` logical CPUs with fresh collective keys
    (skips the calling test when there are not enough devices)."""
    require_replicas(replicas)
    fresh_collective_keys()
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
