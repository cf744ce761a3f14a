"""Config -> layout: table rounding, table and feature stacking, mod sharding with rotation.

`EmbeddingLayout` turns the user's nested `FeatureConfig`s into stacked tables (docs/layout.md#table-layout) using the
C++ `LayoutStacker`, and records for every feature where its samples sit in its stacked table
(docs/layout.md#feature-stacking-and-activation-rows). The user's configs are never mutated.
"""
import dataclasses
import functools
import operator
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from tf_sc_embedding import _core
from tf_sc_embedding import private_tf
from tf_sc_embedding._core import LayoutStacker, TableLayout
from tf_sc_embedding.optimizers.configs import FusedOptimizer, fused_optimizer

__all__ = ["EmbeddingLayout", "FeaturePlacement", "LayoutStacker", "StackedTable", "TableLayout",
           "TablePlacement"]

# SparseCores per replica when the constructor is not told otherwise (as on a TPU v5p chip); the
# C++ core (cc/core/constants.h) is its one home.
DEFAULT_SPARSE_CORES_PER_REPLICA = _core.DEFAULT_SPARSE_CORES_PER_REPLICA

# TensorFlow defaults these per-partition limits to 256 because SparseCore buffers are static. On
# CPU nothing is sized by them, so without a configured value there is no limit (and no
# minibatching); set SparseCoreEmbeddingConfig.max_ids_per_table to get TPU-like minibatches.
DEFAULT_MAX_IDS_PER_TABLE = 1 << 30
DEFAULT_MAX_UNIQUE_IDS_PER_TABLE = 1 << 30


@dataclasses.dataclass(frozen=True)
class TablePlacement:
    """Where one user table lives inside its stacked table."""
    config: object            # the user's TableConfig
    name: str
    layout: TableLayout
    optimizer: FusedOptimizer
    combiner: str
    dtype: str = "float32"    # the storage dtype of its rows: float32, bfloat16 or float16
    rounding: str = "stochastic"   # how 16-bit rows are written back (options.table_rounding)

    @property
    def vocabulary_size(self):
        return self.layout.height

    @property
    def dim(self):
        return self.layout.width

    @property
    def col_offset(self):
        """Stacked col id of this table's first row (docs/layout.md#stacking)."""
        return self.layout.sparse_core_shard_row_offset * self.layout.num_sparse_cores


@dataclasses.dataclass(frozen=True)
class FeaturePlacement:
    """Where one user feature's samples sit in its stacked table's activations (docs/layout.md#feature-stacking-and-activation-rows)."""
    path: str
    config: object            # the user's FeatureConfig
    table: TablePlacement
    output_shape: Tuple[int, ...]
    sample_offset: int

    @property
    def sample_count(self):
        return functools.reduce(operator.mul, self.output_shape, 1)


@dataclasses.dataclass(frozen=True)
class StackedTable:
    """One variable (per replica shard) holding several padded, rotated user tables."""
    name: str
    tables: Tuple[TablePlacement, ...]       # in row-offset order
    features: Tuple[FeaturePlacement, ...]   # in flat feature order
    num_sparse_cores: int                    # N = replicas * SparseCores per replica
    rows_per_shard: int                      # R
    padded_width: int
    sample_count: int                        # B_stk per replica
    max_ids_per_partition: int
    max_unique_ids_per_partition: int

    @property
    def optimizer(self):
        return self.tables[0].optimizer

    @property
    def quantization(self):
        return self.tables[0].config.quantization_config

    @property
    def dtype(self):
        """Storage dtype of the rows (member tables stack only with the same dtype)."""
        return self.tables[0].dtype

    @property
    def rounding(self):
        return self.tables[0].rounding

    @property
    def total_rows(self):
        return self.num_sparse_cores * self.rows_per_shard


def flat_feature_paths(feature_config):
    """The joined string paths ("a/b") of the features, in tf.nest.flatten order."""
    return [path for path, _ in private_tf.flatten_with_joined_string_paths(feature_config)]


def table_names(feature_config):
    """The names of the distinct tables of a feature config (unnamed ones: table_<index>)."""
    tables = []
    for feature in tf.nest.flatten(feature_config):
        if isinstance(feature, tf.tpu.experimental.embedding.FeatureConfig) and \
                not any(feature.table is t for t in tables):
            tables.append(feature.table)
    return {_table_name(t, i): t for i, t in enumerate(tables)}


def _table_name(table, index):
    return table.name if table.name else f"table_{index}"


def _positive_integer(name, value):
    try:
        count = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        count = None
    if count is None or count < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return count


def check_sparse_cores_per_replica(value):
    """sparse_cores_per_replica must be a positive integer (its power-of-two rule, with the
    replica count, is check_sparse_core_count's)."""
    return _positive_integer("sparse_cores_per_replica", value)


def check_sparse_core_count(num_replicas, sparse_cores_per_replica):
    """Every table is sharded over replicas x sparse_cores_per_replica SparseCores, id `i` on
    SparseCore `(i + rotation) mod N` with TensorFlow's bit masks (docs/layout.md#stacking), so N
    must be a power of two: rejected here, before any variable or op exists, instead of by the
    preprocessing ops at the first step. (Replicated tables are laid out for one replica.)"""
    counts = [_positive_integer("number of replicas", num_replicas),
              check_sparse_cores_per_replica(sparse_cores_per_replica)]
    total = counts[0] * counts[1]
    if total & (total - 1):
        raise ValueError(
            f"{num_replicas} replica(s) x sparse_cores_per_replica={sparse_cores_per_replica} = "
            f"{total} SparseCores: the SparseCore layout shards tables over a power-of-two "
            "number of SparseCores (as on TPUs). Use a power-of-two number of replicas (workers "
            "x replicas per worker: 1, 2, 4, 8, ...) and of sparse_cores_per_replica; tables "
            "placed 'replicated' (table_placement) are held whole on every replica and work "
            "with any number of replicas.")


class EmbeddingLayout:
    """The stacked layout of a feature config for a number of replicas and SparseCores."""

    def __init__(self, feature_config, optimizer, num_replicas, sparse_cores_per_replica,
                 output_shapes: Dict[str, Tuple[int, ...]], sparse_core_embedding_config=None,
                 tables: Optional[frozenset] = None, dtypes: Optional[Dict[str, str]] = None,
                 rounding: str = "stochastic"):
        """`tables`: lay out only these table names (and their features); None: all. `dtypes`:
        {table name: storage dtype name}; a table not named is float32."""
        self._dtypes = dict(dtypes or {})
        self._rounding = rounding
        check_sparse_core_count(num_replicas, sparse_cores_per_replica)
        self.num_replicas = num_replicas
        self.sparse_cores_per_replica = sparse_cores_per_replica
        self.num_sparse_cores = num_replicas * sparse_cores_per_replica
        config = sparse_core_embedding_config
        self.flat_paths_and_features = private_tf.flatten_with_joined_string_paths(feature_config)
        self._only = tables
        placements = self._place_tables(self._unique_tables(), optimizer, output_shapes, config)
        self.features = self._place_features(placements, output_shapes)
        self.stacked_tables = self._stack(placements, config)

    def _unique_tables(self):
        tables = []
        for path, feature in self.flat_paths_and_features:
            if not isinstance(feature, tf.tpu.experimental.embedding.FeatureConfig):
                raise ValueError(f"feature '{path}': expected a tf.tpu.experimental.embedding."
                                 f"FeatureConfig, got {type(feature).__name__}")
            if not any(feature.table is t for t in tables):
                tables.append(feature.table)
        names = [_table_name(t, i) for i, t in enumerate(tables)]
        if len(set(names)) != len(names):
            raise ValueError(f"table names must be unique, got {names}")
        return tables

    def _place_tables(self, tables, optimizer, output_shapes, config):
        samples = {id(t): 0 for t in tables}
        counts = {id(t): 0 for t in tables}
        for path, feature in self.flat_paths_and_features:
            samples[id(feature.table)] += functools.reduce(operator.mul, output_shapes[path], 1)
            counts[id(feature.table)] += 1
        stacker = LayoutStacker(self.num_replicas, self.sparse_cores_per_replica,
                                disable_table_stacking=bool(config and
                                                            config.disable_table_stacking))
        bound, groups = {}, {}
        named = sorted(((_table_name(t, i), t) for i, t in enumerate(tables)
                        if self._only is None or _table_name(t, i) in self._only),
                       key=lambda x: x[0])
        for name, table in named:
            where = f"table '{name}'"
            table_optimizer = table.optimizer if table.optimizer is not None else optimizer
            if table_optimizer is None:
                raise ValueError(f"{where} has no optimizer and no global optimizer was given")
            if table.combiner not in ("sum", "mean", "sqrtn"):
                raise ValueError(f"{where}: combiner must be 'sum', 'mean' or 'sqrtn', got "
                                 f"'{table.combiner}'")
            bound[name] = fused_optimizer(table_optimizer, where, table.dim)
            key = (bound[name].stacking_key(), repr(table.quantization_config),
                   self._dtypes.get(name, "float32"))
            group = groups.setdefault(key, f"group_{len(groups):04d}")
            stacker.add_table(name, table.vocabulary_size, table.dim, group,
                              output_samples=samples[id(table)], num_features=counts[id(table)])
        by_name = dict(named)
        return {layout.table_name: TablePlacement(by_name[layout.table_name], layout.table_name,
                                                  layout, bound[layout.table_name],
                                                  by_name[layout.table_name].combiner,
                                                  self._dtypes.get(layout.table_name, "float32"),
                                                  self._rounding)
                for layout in stacker.get_layouts()}

    def _place_features(self, placements, output_shapes):
        by_table = {id(p.config): p for p in placements.values()}
        offsets: Dict[str, int] = {}
        features = []
        for path, feature in self.flat_paths_and_features:
            table = by_table.get(id(feature.table))
            if table is None:   # a table of the other placement
                continue
            stacked = table.layout.stacked_table_name
            shape = tuple(output_shapes[path])
            placement = FeaturePlacement(path, feature, table, shape, offsets.get(stacked, 0))
            offsets[stacked] = placement.sample_offset + placement.sample_count
            features.append(placement)
        return tuple(features)

    def _stack(self, placements, config):
        stacks: Dict[str, List[TablePlacement]] = {}
        for p in placements.values():
            stacks.setdefault(p.layout.stacked_table_name, []).append(p)
        max_ids = (config.max_ids_per_table if config and config.max_ids_per_table else {})
        max_uniques = (config.max_unique_ids_per_table
                       if config and config.max_unique_ids_per_table else {})
        result = {}
        for name, members in stacks.items():
            members.sort(key=lambda p: p.layout.sparse_core_shard_row_offset)
            features = tuple(f for f in self.features if f.table.layout.stacked_table_name == name)
            result[name] = StackedTable(
                name=name, tables=tuple(members), features=features,
                num_sparse_cores=self.num_sparse_cores,
                rows_per_shard=members[0].layout.total_rows_per_sparse_core_shard,
                padded_width=members[0].layout.padded_width,
                sample_count=sum(f.sample_count for f in features),
                max_ids_per_partition=max_ids.get(name, DEFAULT_MAX_IDS_PER_TABLE),
                max_unique_ids_per_partition=max_uniques.get(name,
                                                             DEFAULT_MAX_UNIQUE_IDS_PER_TABLE))
        return result

    def table_layouts(self) -> Dict[str, TableLayout]:
        """Layout of every user table, by table name."""
        return {t.name: t.layout for s in self.stacked_tables.values() for t in s.tables}


SHARDED, REPLICATED = "sharded", "replicated"


class EmbeddingPlan:
    """Where every table lives: mod-sharded over all replicas, or held whole by every replica.

    `sharded` is the layout of the sharded tables over all replicas, `replicated` the layout of
    the replicated ones as if there were one replica (each replica holds all S shards of them),
    `dynamic` the layout of the open-vocabulary tables (docs/dynamic_vocabulary.md), stacked only
    with each other; each is None when it has no table. Replication only exists with several
    replicas.
    """

    def __init__(self, feature_config, optimizer, num_replicas, sparse_cores_per_replica,
                 output_shapes, sparse_core_embedding_config=None, replicated=frozenset(),
                 dtypes=None, rounding="stochastic", dynamic=frozenset()):
        names = table_names(feature_config)
        dynamic = frozenset(dynamic)
        replicated = frozenset(replicated) - dynamic if num_replicas > 1 else frozenset()
        unknown = (replicated | dynamic) - set(names)
        if unknown:
            raise ValueError(f"table_placement names unknown tables {sorted(unknown)}; the "
                             f"tables are {sorted(names)}")
        self.placement = {n: REPLICATED if n in replicated else SHARDED for n in names}
        args = (feature_config, optimizer)
        config = sparse_core_embedding_config
        sharded = frozenset(set(names) - replicated - dynamic)
        self.sharded = (EmbeddingLayout(*args, num_replicas, sparse_cores_per_replica,
                                        output_shapes, config, tables=sharded, dtypes=dtypes,
                                        rounding=rounding)
                        if sharded or not names else None)
        self.dynamic = (EmbeddingLayout(*args, num_replicas, sparse_cores_per_replica,
                                        output_shapes, config, tables=dynamic, dtypes=dtypes,
                                        rounding=rounding)
                        if dynamic else None)
        self.replicated = (EmbeddingLayout(*args, 1, sparse_cores_per_replica, output_shapes,
                                           config, tables=replicated, dtypes=dtypes,
                                           rounding=rounding)
                           if replicated else None)
        self.num_replicas = num_replicas
        self.sparse_cores_per_replica = sparse_cores_per_replica
        by_path = {f.path: f for layout in self.parts() for f in layout.features}
        self.features = tuple(by_path[path] for path in flat_feature_paths(feature_config))
        self.stacked_tables = {name: stacked for layout in self.parts()
                               for name, stacked in layout.stacked_tables.items()}

    def parts(self):
        return [layout for layout in (self.sharded, self.dynamic, self.replicated)
                if layout is not None]

    def table_layouts(self) -> Dict[str, TableLayout]:
        """Layout of every user table, by table name."""
        return {name: t for layout in self.parts() for name, t in layout.table_layouts().items()}
