"""One place that splits the CPU into logical devices, so MirroredStrategy can run 1-8 replicas
in one test process. It must run before TensorFlow initializes its runtime (conftest import)."""
import tensorflow as tf

NUM_LOGICAL_CPUS = 8


def configure():
    """Configures the logical CPUs (if still possible) and returns how many exist."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)
    except RuntimeError:  # the runtime is already initialized
        pass
    return len(tf.config.list_logical_devices("CPU"))
