"""`EmbeddingOptions`: the constructor options this library adds to TensorFlow's `TPUEmbeddingV2`.

They are the one home of the extra options: their defaults, their validation and their config form.
`TPUEmbeddingV2` and `EmbeddingLayer` accept them as keyword arguments (or as `options=`) and hand
them here, and the Keras config stores `to_config()`; adding an option is one field below.
"""
import dataclasses
import json
import numbers
import types
from typing import Any, Mapping

import tensorflow as tf

from tf_sc_embedding.collectives import oneccl_library, replica_group as collectives, transports
from tf_sc_embedding.collectives import wire
from tf_sc_embedding.tables import layout
from tf_sc_embedding.tables.dynamic_vocabulary import DynamicVocabulary
from tf_sc_embedding.tables.layout import DEFAULT_SPARSE_CORES_PER_REPLICA, REPLICATED, SHARDED

EXCHANGES = ("auto", "all_to_all", "all_gather")
NON_FINITE_GRADIENTS = ("error", "skip")
PLACEMENTS = (SHARDED, REPLICATED)


def _by_table_name(option, mapping, expected, value_of):
    """A per-table option ({table name or TableConfig: value}) keyed by table name, as a read-only
    mapping (the options are immutable). value_of(name, value) validates and normalizes a value;
    a table named twice must get the same value."""
    mapping = {} if mapping is None else mapping
    if not isinstance(mapping, Mapping):
        raise ValueError(f"{option} must be a mapping {{table name or TableConfig: {expected}}}, "
                         f"got {mapping!r}")
    by_name = {}
    for key, value in mapping.items():
        name = key.name if isinstance(key, tf.tpu.experimental.embedding.TableConfig) else key
        if not isinstance(name, str):
            raise ValueError(f"{option} keys must be table names or TableConfig objects, "
                             f"got {key!r} ({type(key).__name__})")
        value = value_of(name, value)
        if by_name.get(name, value) != value:
            raise ValueError(f"table '{name}': {option} names it twice, as "
                             f"'{by_name[name]}' and '{value}'")
        by_name[name] = value
    return types.MappingProxyType(dict(sorted(by_name.items())))


def _check_known(option, names, tables_by_name):
    unknown = set(names) - set(tables_by_name)
    if unknown:
        raise ValueError(f"{option} names unknown tables {sorted(unknown)}; the tables are "
                         f"{sorted(tables_by_name)}")


def _placement(name, placement):
    if placement not in PLACEMENTS:
        raise ValueError(f"table '{name}': table_placement must be '{SHARDED}' or "
                         f"'{REPLICATED}', got {placement!r}")
    return placement


TABLE_DTYPES = ("float32", "bfloat16", "float16")


def _dtype_name(name, dtype):
    dtype_name = getattr(dtype, "name", dtype)
    if dtype_name == "int8":
        raise ValueError(f"table '{name}': int8 is not a training format; tables train in "
                         f"{TABLE_DTYPES} and export_serving(quantize='int8') writes int8")
    if dtype_name not in TABLE_DTYPES:
        raise ValueError(f"table '{name}': table_dtypes must be one of {TABLE_DTYPES}, got "
                         f"{dtype!r}")
    return dtype_name


@dataclasses.dataclass(frozen=True)
class EmbeddingOptions:
    """The options `TPUEmbeddingV2` and `EmbeddingLayer` take beyond TensorFlow's arguments.

    sparse_cores_per_replica: SparseCores per replica, i.e. the shards of every table that one
      replica holds (TensorFlow's layout has 4 per chip).
    exchange: how replicas exchange ids and rows. "all_to_all" sends each id to the replica that
      owns its shard and the rows back (bytes per replica do not grow with the replica count);
      "all_gather" gives every replica every replica's ids and sums partial activations, and is
      the exchange that implements SparseCore's per-partition limits (minibatches, id dropping).
      "auto" picks "all_gather" when `sparse_core_embedding_config` sets per-table limits or id
      dropping, else "all_to_all". One replica needs no exchange.
    collective_timeout_seconds: a step whose collective waits longer fails (e.g. a worker died),
      with an error naming the transport (and, on oneCCL, the peer); 0 waits forever.
    exchange_transport: what carries the collectives between worker processes
      (docs/multi_worker.md#transports). "oneccl": Intel's oneCCL (shared memory within a host,
      TCP between hosts; `pip install .[oneccl]`; one replica per worker). "tensorflow":
      TensorFlow's collective ops (gRPC between workers). "auto" (the default): "oneccl" when it
      is installed and the job has several workers of one replica each, else "tensorflow".
    replication_threshold_bytes: with several replicas, tables whose parameters take at most this
      many bytes (vocabulary_size x dim x 4) are held whole by every replica, looked up locally
      and updated alike after a sparse allreduce of the touched rows. 0 (the default, TensorFlow's
      layout) shards every table.
    table_placement: {table name or TableConfig: "sharded" | "replicated"}, overriding the
      threshold per table.
    track_sparse_core_stats: measure every enqueued batch's SparseCore partition statistics of the
      sharded tables (`sparse_core_stats`, TensorBoard summaries).
    non_finite_gradients: what `apply_gradients` does when a feature's activation gradient has a
      NaN or Inf on any replica (docs/optimizers.md#non-finite-gradients). "error": the step fails
      on every replica, naming each such feature and table, before anything is written. "skip":
      rows with a non-finite gradient keep their values and slots and are counted
      (`counters().skipped_gradient_rows`); the other rows are updated.
    adapt_sparse_core_limits: raise each sharded stacked table's partition limits online to the
      statistics agreed over all replicas and workers, logging each raise (`sparse_core_limits`).
      Needs track_sparse_core_stats.
    table_dtypes: {table name or TableConfig: tf.float32 | tf.bfloat16 | tf.float16}, the dtype
      a table's rows are stored in (default float32). 16-bit rows are read into float32, updated
      in float32 and written back with stochastic rounding (docs/optimizers.md#storage-precision);
      activations, gradients and optimizer slots stay float32.
    table_rounding: how the update writes 16-bit rows back: "stochastic" (the default; unbiased,
      reproducible on any topology) or "nearest" (round to nearest even; updates smaller than
      half a step are lost, kept for comparison).
    dynamic_vocabularies: {table name or TableConfig: DynamicVocabulary}, the tables whose ids
      are open-ended int64 or string keys, mapped to rows as they arrive; such a table's
      vocabulary_size is the number of rows it holds (docs/dynamic_vocabulary.md).
    wire_precision: the dtype of the rows and gradients the all-to-all exchanges send between
      replicas. "float32" (the default) sends them exactly; "16bit" sends rows as float16 and
      gradients as bfloat16, rounded to nearest even, for half the bytes
      (docs/multi_worker.md#wire-precision). One replica sends nothing either way.
    delta_tracking: whether the training step marks the rows it updates, so that
      `export_delta` can write what changed since the previous delta (docs/deltas.md): one byte
      per stored row, and a mark per updated row each step. Off by default.
    """
    sparse_cores_per_replica: int = DEFAULT_SPARSE_CORES_PER_REPLICA
    exchange: str = "auto"
    collective_timeout_seconds: float = collectives.DEFAULT_TIMEOUT_SECONDS
    replication_threshold_bytes: int = 0
    table_placement: Mapping[str, str] = dataclasses.field(default_factory=dict)
    track_sparse_core_stats: bool = True
    non_finite_gradients: str = "error"
    adapt_sparse_core_limits: bool = False
    table_dtypes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    table_rounding: str = "stochastic"
    dynamic_vocabularies: Mapping[str, DynamicVocabulary] = dataclasses.field(
        default_factory=dict)
    wire_precision: str = "float32"
    exchange_transport: str = "auto"
    delta_tracking: bool = False

    def __post_init__(self):
        object.__setattr__(self, "table_placement", _by_table_name(
            "table_placement", self.table_placement, f"'{SHARDED}' | '{REPLICATED}'", _placement))
        object.__setattr__(self, "table_dtypes", _by_table_name(
            "table_dtypes", self.table_dtypes, " | ".join(TABLE_DTYPES), _dtype_name))
        object.__setattr__(self, "dynamic_vocabularies", _by_table_name(
            "dynamic_vocabularies", self.dynamic_vocabularies, "DynamicVocabulary",
            DynamicVocabulary.of))
        layout.check_sparse_cores_per_replica(self.sparse_cores_per_replica)
        _require_int("replication_threshold_bytes", self.replication_threshold_bytes, minimum=0)
        _require_choice("exchange", self.exchange, EXCHANGES)
        _require_choice("non_finite_gradients", self.non_finite_gradients, NON_FINITE_GRADIENTS)
        _require_choice("table_rounding", self.table_rounding, ("stochastic", "nearest"))
        _require_choice("wire_precision", self.wire_precision, wire.WIRE_PRECISIONS)
        _require_choice("exchange_transport", self.exchange_transport, transports.TRANSPORTS)
        if self.exchange_transport == "oneccl":
            oneccl_library.require_installed()
        timeout = self.collective_timeout_seconds
        if (not isinstance(timeout, numbers.Real) or isinstance(timeout, bool) or
                not timeout >= 0 or timeout == float("inf")):
            raise ValueError(f"collective_timeout_seconds must be a finite number >= 0 (0 waits "
                             f"forever), got {timeout!r}")
        for name in ("track_sparse_core_stats", "adapt_sparse_core_limits", "delta_tracking"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.adapt_sparse_core_limits and not self.track_sparse_core_stats:
            raise ValueError("adapt_sparse_core_limits needs track_sparse_core_stats=True (the "
                             "limits are raised to the measured statistics)")

    def __hash__(self):
        return hash(json.dumps(self.to_config(), sort_keys=True, default=_plain))

    def __reduce__(self):   # the read-only mapping does not pickle; the config does
        return (type(self).from_config, (self.to_config(),))

    def __deepcopy__(self, memo):
        return self   # immutable

    # ------------------------------------------------------------------ construction
    @classmethod
    def field_names(cls):
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_arguments(cls, options=None, **kwargs):
        """The options given as `options=` or as keyword arguments (not both)."""
        if options is not None:
            if kwargs:
                raise ValueError(f"pass either options= or the keyword arguments "
                                 f"{sorted(kwargs)}, not both")
            if not isinstance(options, cls):
                raise TypeError(f"options must be an EmbeddingOptions, got "
                                f"{type(options).__name__}")
            return options
        unknown = set(kwargs) - set(cls.field_names())
        if unknown:
            raise TypeError(f"unknown option(s) {sorted(unknown)}; the options are "
                            f"{list(cls.field_names())}")
        return cls(**kwargs)

    @classmethod
    def split_arguments(cls, kwargs):
        """(the options among kwargs, the other kwargs): e.g. a Keras layer's own arguments."""
        names = set(cls.field_names())
        return ({k: v for k, v in kwargs.items() if k in names},
                {k: v for k, v in kwargs.items() if k not in names})

    # ------------------------------------------------------------------ config form
    def to_config(self):
        """A JSON-serializable dict of every option (Keras `get_config`)."""
        config = {name: getattr(self, name) for name in self.field_names()}
        config["table_placement"] = dict(self.table_placement)
        config["table_dtypes"] = dict(self.table_dtypes)
        config["dynamic_vocabularies"] = {name: vocabulary.to_config() for name, vocabulary
                                          in self.dynamic_vocabularies.items()}
        return config

    @classmethod
    def from_config(cls, config: Mapping[str, Any]):
        return cls.from_arguments(**dict(config))

    # ------------------------------------------------------------------ rules
    def replica_group_arguments(self):
        """The keyword arguments of collectives.ReplicaGroup these options decide."""
        return dict(timeout_seconds=self.collective_timeout_seconds,
                    wire_precision=self.wire_precision, transport=self.exchange_transport)

    def storage_dtypes(self, tables_by_name):
        """{table name: dtype name} of every table (float32 unless table_dtypes says otherwise);
        a table_dtypes key naming no table fails."""
        _check_known("table_dtypes", self.table_dtypes, tables_by_name)
        return {name: self.table_dtypes.get(name, "float32") for name in tables_by_name}

    def dynamic_tables(self, tables_by_name):
        """{table name: DynamicVocabulary} of the open-vocabulary tables; a dynamic_vocabularies
        key naming no table fails."""
        _check_known("dynamic_vocabularies", self.dynamic_vocabularies, tables_by_name)
        return dict(self.dynamic_vocabularies)

    def replicated_tables(self, tables_by_name, num_replicas):
        """Names of the tables held whole by every replica: only with several replicas; a table
        is replicated when table_placement says so, or when it names no placement and its
        parameters take at most replication_threshold_bytes."""
        _check_known("table_placement", self.table_placement, tables_by_name)
        if num_replicas == 1:
            return frozenset()
        replicated = set()
        for name, table in tables_by_name.items():
            placement = self.table_placement.get(name)
            size = int(table.vocabulary_size) * int(table.dim) * 4
            if placement == REPLICATED or (placement is None and
                                           size <= self.replication_threshold_bytes):
                replicated.add(name)
        return frozenset(replicated)


def _plain(value):
    """numpy scalars (and anything else json does not know) in the hash of the options."""
    return value.item() if hasattr(value, "item") else repr(value)


def _require_int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _require_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
