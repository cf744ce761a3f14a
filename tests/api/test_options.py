"""`EmbeddingOptions` on its own (tf_sc_embedding/options.py): defaults, validation, the config
form, the table-placement rule, and the two ways `TPUEmbeddingV2` and `EmbeddingLayer` take the
options (keyword arguments or `options=`)."""
import dataclasses
import json

import numpy as np
import pytest
import tensorflow as tf

from tf_sc_embedding.collectives import replica_group as collectives
from tf_sc_embedding.keras.layer import EmbeddingLayer
from tf_sc_embedding.tables.layout import DEFAULT_SPARSE_CORES_PER_REPLICA
from tf_sc_embedding.options import EmbeddingOptions
import tf_sc_embedding as sce

E = tf.tpu.experimental.embedding

# One non-default value for every option (a valid combination).
NON_DEFAULT = dict(sparse_cores_per_replica=2, exchange="all_gather",
                   collective_timeout_seconds=12.5, replication_threshold_bytes=4096,
                   table_placement={"big": "replicated", "small": "sharded"},
                   track_sparse_core_stats=True, non_finite_gradients="skip",
                   adapt_sparse_core_limits=True, wire_precision="16bit")


def table(name, vocabulary_size, dim):
    return E.TableConfig(vocabulary_size=vocabulary_size, dim=dim, name=name)


def feature_config():
    return {"a": E.FeatureConfig(table=table("ta", 16, 4), name="a"),
            "b": E.FeatureConfig(table=table("tb", 8, 2), name="b")}


# ------------------------------------------------------------------------------------- defaults
def test_defaults():
    o = EmbeddingOptions()
    assert o.sparse_cores_per_replica == DEFAULT_SPARSE_CORES_PER_REPLICA
    assert o.exchange == "auto"
    assert o.collective_timeout_seconds == collectives.DEFAULT_TIMEOUT_SECONDS == 60   # a dead worker fails a step
    assert o.exchange_transport == "auto" and o.wire_precision == "float32"
    assert o.replication_threshold_bytes == 0          # every table sharded
    assert o.table_placement == {}
    assert o.track_sparse_core_stats is True
    assert o.non_finite_gradients == "error"
    assert o.adapt_sparse_core_limits is False
    assert o.table_dtypes == {} and o.table_rounding == "stochastic"
    assert EmbeddingOptions() == o
    # The default table_placement is not shared between instances.
    assert EmbeddingOptions().table_placement is not o.table_placement


def test_default_threshold_shards_every_table():
    tables = {"tiny": table("tiny", 1, 1), "t": table("t", 16, 4)}
    assert EmbeddingOptions().replicated_tables(tables, num_replicas=4) == frozenset()


def test_field_names_are_the_dataclass_fields():
    assert EmbeddingOptions.field_names() == (
        "sparse_cores_per_replica", "exchange", "collective_timeout_seconds",
        "replication_threshold_bytes", "table_placement", "track_sparse_core_stats",
        "non_finite_gradients", "adapt_sparse_core_limits", "table_dtypes", "table_rounding",
        "dynamic_vocabularies", "wire_precision", "exchange_transport", "delta_tracking")
    assert EmbeddingOptions.field_names() == tuple(
        f.name for f in dataclasses.fields(EmbeddingOptions))


def test_every_valid_choice_is_accepted():
    for exchange in ("auto", "all_to_all", "all_gather"):
        assert EmbeddingOptions(exchange=exchange).exchange == exchange
    for mode in ("error", "skip"):
        assert EmbeddingOptions(non_finite_gradients=mode).non_finite_gradients == mode
    for timeout in (0, 0.5, 3, np.float32(2.0)):
        assert EmbeddingOptions(collective_timeout_seconds=timeout)
    for threshold in (0, 1, 10**12, np.int64(7)):
        assert EmbeddingOptions(replication_threshold_bytes=threshold)
    o = EmbeddingOptions(**NON_DEFAULT)
    for name, value in NON_DEFAULT.items():
        assert getattr(o, name) == value, name


# ----------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kwargs,option", [
    (dict(exchange="ring"), "exchange"),
    (dict(exchange=None), "exchange"),
    (dict(exchange="ALL_TO_ALL"), "exchange"),
    (dict(non_finite_gradients="ignore"), "non_finite_gradients"),
    (dict(non_finite_gradients=True), "non_finite_gradients"),
    (dict(replication_threshold_bytes=-1), "replication_threshold_bytes"),
    (dict(replication_threshold_bytes=1.5), "replication_threshold_bytes"),
    (dict(replication_threshold_bytes=1024.0), "replication_threshold_bytes"),
    (dict(replication_threshold_bytes=True), "replication_threshold_bytes"),
    (dict(replication_threshold_bytes=False), "replication_threshold_bytes"),
    (dict(replication_threshold_bytes="1024"), "replication_threshold_bytes"),
    (dict(replication_threshold_bytes=None), "replication_threshold_bytes"),
    (dict(collective_timeout_seconds=-1), "collective_timeout_seconds"),
    (dict(collective_timeout_seconds=-0.5), "collective_timeout_seconds"),
    (dict(collective_timeout_seconds=float("inf")), "collective_timeout_seconds"),
    (dict(collective_timeout_seconds=float("nan")), "collective_timeout_seconds"),
    (dict(collective_timeout_seconds="10"), "collective_timeout_seconds"),
    (dict(collective_timeout_seconds=None), "collective_timeout_seconds"),
    (dict(collective_timeout_seconds=True), "collective_timeout_seconds"),
    (dict(track_sparse_core_stats=1), "track_sparse_core_stats"),
    (dict(track_sparse_core_stats="yes"), "track_sparse_core_stats"),
    (dict(track_sparse_core_stats=None), "track_sparse_core_stats"),
    (dict(adapt_sparse_core_limits=0), "adapt_sparse_core_limits"),
    (dict(adapt_sparse_core_limits="no"), "adapt_sparse_core_limits"),
    (dict(adapt_sparse_core_limits=True, track_sparse_core_stats=False),
     "adapt_sparse_core_limits"),
    (dict(table_placement={"t": "mirrored"}), "table_placement"),
    (dict(table_placement={"t": None}), "table_placement"),
    (dict(table_placement={"t": "Replicated"}), "table_placement"),
    (dict(table_placement={3: "sharded"}), "table_placement"),
    (dict(table_placement={("t",): "sharded"}), "table_placement"),
])
def test_invalid_option_fails_naming_it(kwargs, option):
    with pytest.raises(ValueError, match=option):
        EmbeddingOptions(**kwargs)


def test_bad_table_placement_value_names_the_table_and_the_value():
    with pytest.raises(ValueError, match=r"table 'users'.*'sharded'.*'replicated'.*mirrored"):
        EmbeddingOptions(table_placement={"users": "mirrored"})


def test_bad_table_placement_key_names_the_key_and_its_type():
    with pytest.raises(ValueError, match=r"TableConfig.*3 \(int\)"):
        EmbeddingOptions(table_placement={3: "sharded"})


def test_validation_also_applies_through_from_arguments_and_from_config():
    with pytest.raises(ValueError, match="exchange"):
        EmbeddingOptions.from_arguments(exchange="ring")
    config = EmbeddingOptions().to_config()
    config["non_finite_gradients"] = "zero"
    with pytest.raises(ValueError, match="non_finite_gradients"):
        EmbeddingOptions.from_config(config)


# ------------------------------------------------------------------------------ table_placement
def test_table_config_keys_are_normalized_to_names():
    users, items = table("users", 100, 8), table("items", 10, 4)
    o = EmbeddingOptions(table_placement={users: "replicated", items: "sharded"})
    assert o.table_placement == {"users": "replicated", "items": "sharded"}
    assert all(isinstance(k, str) for k in o.table_placement)
    # Keyed by TableConfig or by name: the same options.
    assert o == EmbeddingOptions(table_placement={"items": "sharded", "users": "replicated"})
    # Sorted by name, so that the config form does not depend on the order given.
    assert list(o.table_placement) == ["items", "users"]


def test_table_placement_is_copied_from_the_argument():
    given = {"t": "replicated"}
    o = EmbeddingOptions(table_placement=given)
    given["t"] = "sharded"
    given["u"] = "sharded"
    assert o.table_placement == {"t": "replicated"}


def test_table_placement_none_means_no_overrides():
    assert EmbeddingOptions(table_placement=None).table_placement == {}


# ---------------------------------------------------------------------------------- config form
@pytest.mark.parametrize("kwargs", [{}, NON_DEFAULT], ids=["defaults", "non_default"])
def test_to_config_is_json_serializable_and_round_trips(kwargs):
    o = EmbeddingOptions(**kwargs)
    config = o.to_config()
    assert set(config) == set(EmbeddingOptions.field_names())
    text = json.dumps(config)
    assert EmbeddingOptions.from_config(config) == o
    assert EmbeddingOptions.from_config(json.loads(text)) == o
    assert EmbeddingOptions.from_config(json.loads(text)).to_config() == config


def test_to_config_with_table_config_keys_is_json_serializable():
    o = EmbeddingOptions(table_placement={table("users", 100, 8): "replicated"})
    config = json.loads(json.dumps(o.to_config()))
    assert config["table_placement"] == {"users": "replicated"}
    assert EmbeddingOptions.from_config(config) == o


def test_to_config_returns_a_copy_of_table_placement():
    o = EmbeddingOptions(table_placement={"t": "replicated"})
    config = o.to_config()
    config["table_placement"]["t"] = "sharded"
    assert o.table_placement == {"t": "replicated"}


def test_from_config_rejects_unknown_keys_naming_them():
    config = EmbeddingOptions().to_config()
    config["replication_threshold"] = 10
    with pytest.raises(TypeError, match="replication_threshold"):
        EmbeddingOptions.from_config(config)


# --------------------------------------------------------------------------------- construction
def test_from_arguments_takes_keyword_arguments_or_options():
    assert EmbeddingOptions.from_arguments() == EmbeddingOptions()
    assert EmbeddingOptions.from_arguments(None, exchange="all_gather") == \
        EmbeddingOptions(exchange="all_gather")
    o = EmbeddingOptions(replication_threshold_bytes=64)
    assert EmbeddingOptions.from_arguments(o) is o
    assert EmbeddingOptions.from_arguments(options=o) is o


def test_from_arguments_with_options_and_keyword_arguments_fails():
    o = EmbeddingOptions()
    with pytest.raises(ValueError, match=r"options=.*\['exchange'\].*not both"):
        EmbeddingOptions.from_arguments(o, exchange="all_gather")


def test_from_arguments_rejects_what_is_not_embedding_options():
    with pytest.raises(TypeError, match="EmbeddingOptions.*dict"):
        EmbeddingOptions.from_arguments({"exchange": "all_gather"})


def test_from_arguments_rejects_unknown_keyword_arguments_naming_them():
    with pytest.raises(TypeError, match=r"\['bogus', 'exchnage'\]"):
        EmbeddingOptions.from_arguments(exchnage="all_gather", bogus=1, exchange="auto")


def test_split_arguments_separates_options_from_other_arguments():
    options, others = EmbeddingOptions.split_arguments(
        dict(name="emb", exchange="all_gather", dtype="float32", replication_threshold_bytes=8,
             table_placement={"t": "sharded"}))
    assert options == dict(exchange="all_gather", replication_threshold_bytes=8,
                           table_placement={"t": "sharded"})
    assert others == dict(name="emb", dtype="float32")
    assert EmbeddingOptions.split_arguments({}) == ({}, {})
    # Every option field is recognized.
    config = EmbeddingOptions().to_config()
    assert EmbeddingOptions.split_arguments(config) == (config, {})


def test_frozen():
    o = EmbeddingOptions()
    for name, value in (("exchange", "all_gather"), ("replication_threshold_bytes", 5),
                        ("table_placement", {"t": "replicated"})):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(o, name, value)
    assert o == EmbeddingOptions()
    # dataclasses.replace validates the new object too.
    assert dataclasses.replace(o, exchange="all_gather").exchange == "all_gather"
    with pytest.raises(ValueError, match="exchange"):
        dataclasses.replace(o, exchange="ring")


# ------------------------------------------------------------------------------ placement rule
TABLES = {"small": table("small", 4, 4),      # 64 bytes
          "medium": table("medium", 8, 8),    # 256 bytes
          "big": table("big", 64, 16)}        # 4096 bytes


@pytest.mark.parametrize("threshold,expected", [
    (0, set()), (63, set()), (64, {"small"}), (255, {"small"}), (256, {"small", "medium"}),
    (4095, {"small", "medium"}), (4096, {"small", "medium", "big"}),
    (10**9, {"small", "medium", "big"})])
def test_replicated_tables_threshold_rule(threshold, expected):
    o = EmbeddingOptions(replication_threshold_bytes=threshold)
    got = o.replicated_tables(TABLES, num_replicas=2)
    assert isinstance(got, frozenset)
    assert got == expected


def test_table_placement_overrides_the_threshold_both_ways():
    o = EmbeddingOptions(replication_threshold_bytes=256,
                         table_placement={"small": "sharded", "big": "replicated"})
    assert o.replicated_tables(TABLES, num_replicas=4) == {"medium", "big"}
    o = EmbeddingOptions(table_placement={TABLES["big"]: "replicated"})
    assert o.replicated_tables(TABLES, num_replicas=2) == {"big"}
    o = EmbeddingOptions(replication_threshold_bytes=10**9,
                         table_placement={"small": "sharded", "medium": "sharded",
                                          "big": "sharded"})
    assert o.replicated_tables(TABLES, num_replicas=2) == frozenset()


def test_table_placement_naming_unknown_tables_fails():
    o = EmbeddingOptions(table_placement={"huge": "replicated", "small": "sharded",
                                          "gone": "sharded"})
    with pytest.raises(ValueError, match=r"unknown tables \['gone', 'huge'\]"):
        o.replicated_tables(TABLES, num_replicas=2)
    # Also with one replica: a misspelt name is an error whatever the strategy.
    with pytest.raises(ValueError, match="huge"):
        o.replicated_tables(TABLES, num_replicas=1)


def test_one_replica_replicates_nothing():
    o = EmbeddingOptions(replication_threshold_bytes=10**9, table_placement={"big": "replicated"})
    assert o.replicated_tables(TABLES, num_replicas=1) == frozenset()


# ------------------------------------------------------------------- TPUEmbeddingV2 and the layer
def test_tpu_embedding_accepts_keyword_arguments_or_options():
    by_kwargs = sce.TPUEmbeddingV2(feature_config(), E.SGD(0.1), exchange="all_gather",
                                   replication_threshold_bytes=64, non_finite_gradients="skip")
    expected = EmbeddingOptions(exchange="all_gather", replication_threshold_bytes=64,
                                non_finite_gradients="skip")
    assert by_kwargs.options == expected
    o = EmbeddingOptions(collective_timeout_seconds=3.0, table_placement={"ta": "replicated"})
    by_options = sce.TPUEmbeddingV2(feature_config(), E.SGD(0.1), options=o)
    assert by_options.options is o
    assert sce.TPUEmbeddingV2(feature_config(), E.SGD(0.1)).options == EmbeddingOptions()


def test_tpu_embedding_rejects_both_forms_unknown_and_invalid_options():
    with pytest.raises(ValueError, match="not both"):
        sce.TPUEmbeddingV2(feature_config(), E.SGD(0.1), options=EmbeddingOptions(),
                           exchange="all_gather")
    with pytest.raises(TypeError, match="exchnage"):
        sce.TPUEmbeddingV2(feature_config(), E.SGD(0.1), exchnage="all_gather")
    with pytest.raises(ValueError, match="replication_threshold_bytes"):
        sce.TPUEmbeddingV2(feature_config(), E.SGD(0.1), replication_threshold_bytes=-1)
    with pytest.raises(ValueError, match="unknown tables"):
        sce.TPUEmbeddingV2(feature_config(), E.SGD(0.1), table_placement={"tc": "replicated"})


def test_package_exports_the_same_class():
    assert getattr(sce, "EmbeddingOptions", EmbeddingOptions) is EmbeddingOptions


def test_layer_accepts_keyword_arguments_or_options():
    layer = EmbeddingLayer(feature_config(), optimizer=E.SGD(0.1), exchange="all_gather",
                           collective_timeout_seconds=5, name="emb")
    assert layer.name == "emb"
    assert layer.embedding.options == EmbeddingOptions(exchange="all_gather",
                                                       collective_timeout_seconds=5)
    o = EmbeddingOptions(non_finite_gradients="skip")
    layer = EmbeddingLayer(feature_config(), optimizer=E.SGD(0.1), options=o, name="emb2")
    assert layer.embedding.options is o
    assert layer.name == "emb2"
    with pytest.raises(ValueError, match="not both"):
        EmbeddingLayer(feature_config(), optimizer=E.SGD(0.1), options=o, exchange="auto")


def test_layer_get_config_holds_every_option_and_round_trips():
    o = EmbeddingOptions(**dict(NON_DEFAULT, table_placement={"ta": "replicated"}))
    layer = EmbeddingLayer(feature_config(), optimizer=E.SGD(0.1), options=o, name="emb")
    config = layer.get_config()
    for name in EmbeddingOptions.field_names():
        assert name in config, name
        assert config[name] == getattr(o, name), name
    assert "options" not in config
    json.dumps({name: config[name] for name in EmbeddingOptions.field_names()})
    again = EmbeddingLayer.from_config(config)
    assert again.embedding.options == o
    assert again.name == "emb"
    # The default options are all in the config too.
    config = EmbeddingLayer(feature_config(), optimizer=E.SGD(0.1)).get_config()
    assert {n: config[n] for n in EmbeddingOptions.field_names()} == \
        EmbeddingOptions().to_config()


@pytest.mark.parametrize("cores", [0, -1, 2.5, "4"])
def test_tpu_embedding_rejects_bad_sparse_cores_per_replica_naming_it(cores):
    with pytest.raises(ValueError, match="sparse_cores_per_replica"):
        sce.TPUEmbeddingV2(feature_config(), E.SGD(0.1), sparse_cores_per_replica=cores)


@pytest.mark.parametrize("cores", [0, -1, 2.5, True, "4", None])
def test_bad_sparse_cores_per_replica_fails_in_the_options(cores):
    with pytest.raises(ValueError, match="sparse_cores_per_replica must be a positive integer"):
        EmbeddingOptions(sparse_cores_per_replica=cores)


def test_options_are_immutable_hashable_and_copy_as_themselves():
    import copy  # pylint: disable=import-outside-toplevel
    import pickle  # pylint: disable=import-outside-toplevel
    options = EmbeddingOptions(**NON_DEFAULT)
    with pytest.raises(TypeError):
        options.table_placement["other"] = "sharded"
    assert hash(options) == hash(EmbeddingOptions(**NON_DEFAULT))
    assert hash(options) != hash(EmbeddingOptions())
    assert copy.deepcopy(options) is options
    assert pickle.loads(pickle.dumps(options)) == options


def test_table_placement_naming_a_table_twice_differently_fails():
    config = table("t", 16, 4)
    with pytest.raises(ValueError, match="table 't': table_placement names it twice"):
        EmbeddingOptions(table_placement={config: "replicated", "t": "sharded"})
    same = EmbeddingOptions(table_placement={config: "replicated", "t": "replicated"})
    assert dict(same.table_placement) == {"t": "replicated"}


def test_table_placement_that_is_not_a_mapping_fails_naming_it():
    with pytest.raises(ValueError, match="table_placement must be a mapping"):
        EmbeddingOptions(table_placement="ab")
