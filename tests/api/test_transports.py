"""The exchange_transport option and the oneCCL settings, in one process (tests/multiworker runs
the transports between worker processes)."""
import os

import pytest
import tensorflow as tf

import tf_sc_embedding as sce
from tests import devices
from tf_sc_embedding.collectives import oneccl, oneccl_library
from tf_sc_embedding.collectives import replica_group as collectives

E = tf.tpu.experimental.embedding


def features():
    table = E.TableConfig(vocabulary_size=8, dim=4, name="t")
    return {"f": E.FeatureConfig(table=table)}


def test_an_unknown_transport_fails_at_construction():
    with pytest.raises(ValueError, match="exchange_transport must be one of"):
        sce.TPUEmbeddingV2(features(), E.SGD(), exchange_transport="mpi")


def test_oneccl_without_the_extra_fails_at_construction_with_the_install_command(monkeypatch):
    monkeypatch.setattr(oneccl_library, "installation", lambda: None)
    with pytest.raises(ValueError, match=r"pip install \.\[oneccl\]"):
        sce.TPUEmbeddingV2(features(), E.SGD(), exchange_transport="oneccl")
    with pytest.raises(ValueError, match=r"pip install \.\[oneccl\]"):
        sce.EmbeddingOptions(exchange_transport="oneccl")


def test_auto_and_one_process_use_tensorflows_collectives():
    embedding = sce.TPUEmbeddingV2(features(), E.SGD())
    assert embedding.options.exchange_transport == "auto"
    group = collectives.ReplicaGroup(tf.distribute.get_strategy(), transport="auto")
    assert group.transport.name == "tensorflow"


def test_oneccl_refuses_replicas_that_share_a_process(monkeypatch):
    devices.require_replicas(2)
    monkeypatch.setattr(oneccl_library, "is_installed", lambda: True)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with pytest.raises(ValueError, match="one replica per worker"):
        collectives.ReplicaGroup(strategy, transport="oneccl")
    assert collectives.ReplicaGroup(strategy, transport="auto").transport.name == "tensorflow"


def test_the_option_round_trips_through_the_config():
    options = sce.EmbeddingOptions(exchange_transport="tensorflow")
    assert sce.EmbeddingOptions.from_config(options.to_config()) == options


class FakeInstallation:
    fabric = "/x/lib/libfabric/libfabric.so"
    providers = "/x/lib/libfabric/prov"


def test_settings_on_one_host_use_shared_memory_and_the_loopback_interface():
    values = oneccl.settings(["127.0.0.1:1000", "localhost:1001"], 1, FakeInstallation)
    assert values["CCL_LOCAL_RANK"] == "1" and values["CCL_LOCAL_SIZE"] == "2"
    assert "FI_PROVIDER" not in values   # libfabric's default: shared memory
    assert values["CCL_KVS_IFACE"] == values["FI_TCP_IFACE"] == "lo"
    assert values["CCL_ATL_TRANSPORT"] == "ofi" and values["CCL_PROCESS_LAUNCHER"] == "none"
    assert values["CCL_WORKER_OFFLOAD"] == "0"
    assert values["CCL_OFI_LIBRARY_PATH"] == FakeInstallation.fabric


def test_settings_over_hosts_use_tcp_and_count_local_ranks_per_host():
    peers = ["hosta:1", "hostb:1", "hosta:2", "hostb:2"]
    values = [oneccl.settings(peers, r, FakeInstallation) for r in range(4)]
    assert [v["CCL_LOCAL_RANK"] for v in values] == ["0", "0", "1", "1"]
    assert all(v["CCL_LOCAL_SIZE"] == "2" and v["FI_PROVIDER"] == "tcp" for v in values)
    assert all("CCL_KVS_IFACE" not in v for v in values)


def test_the_users_settings_win(monkeypatch):
    monkeypatch.setenv("FI_PROVIDER", "tcp")
    monkeypatch.setenv("CCL_WORKER_OFFLOAD", "unset below; restored to its state after the test")
    monkeypatch.delenv("CCL_WORKER_OFFLOAD")
    applied = oneccl.apply_settings({"FI_PROVIDER": "shm", "CCL_WORKER_OFFLOAD": "0"})
    assert applied == {"CCL_WORKER_OFFLOAD": "0"}
    assert os.environ["FI_PROVIDER"] == "tcp"


@pytest.mark.oneccl
@pytest.mark.parametrize("shape,lengths,error", [
    ([2, 4], [3, 5], r"lengths\[1\] = 5 is outside \[0, 4\]"),
    ([2, 4], [-1, 0], r"lengths\[0\] = -1 is outside \[0, 4\]"),
    ([3, 4], [1, 1, 1], r"the input must be \[group_size = 2, chunk\], got shape \[3,4\]"),
    ([2, 4], [1, 1], r"communicator 'none' is not formed in this process"),
])
def test_a_ragged_all_to_all_checks_its_arguments_before_it_moves_a_byte(shape, lengths, error):
    """Lengths outside the chunk, a wrong shape or an unformed communicator fail in the kernel
    with an error naming what is wrong, before anything is sent."""
    ops = oneccl_library.load()
    token = tf.Variable(0.0)
    # Shapes unknown when traced, so that the kernel, not the shape function, checks them.
    run = tf.function(lambda x, n: ops.sce_oneccl_ragged_all_to_all(
        input=x, lengths=n, ordering_token=token.handle, communicator="none", group_size=2),
        input_signature=[tf.TensorSpec(None, tf.float32), tf.TensorSpec(None, tf.int64)])
    with pytest.raises((tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError),
                       match=error):
        run(tf.zeros(shape), tf.constant(lengths, tf.int64))
