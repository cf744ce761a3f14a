"""Python reference of the table layout (docs/layout.md#table-layout), written from the spec.

* `ReferenceStacker`: docs/layout.md#stacking construction, docs/layout.md#rounding-rows-and-columns AddTable (padding, first-fit stacking with strict
  limits, row offsets, rotations), docs/layout.md#stacking GetLayouts ordering and stacked names.
* `logical_to_storage`, `col_id`: docs/layout.md#mod-sharding mapping of a logical table row to its shard, row in shard,
  row in the stacked variable, partition and row in the partition; and the host "col id" formula.
* `unshuffle_from_sc_to_cpu`, `shard_tables`: docs/layout.md#mod-sharding inverse mapping and the CPU -> SC sharding of
  a whole stack, used to build stacked variables in tests.
"""
import dataclasses

import numpy as np

XLA_PAD = 8
ACTIVATION_MEM_BYTES_LIMIT = 2 * 1024 * 1024
VARIABLE_SHARD_BYTES_LIMIT = 2 * 1024 * 1024 * 1024
ROW_LIMIT = 2 ** 31 - 1
TABLE_LIMIT = 2 ** 31 - 1


def round_up(x, m):
    return (x + m - 1) // m * m


@dataclasses.dataclass
class RefLayout:
    table_name: str
    stacked_table_name: str
    num_sparse_cores: int
    num_partitions: int
    height: int
    width: int
    padded_height: int
    padded_width: int
    sparse_core_shard_row_offset: int
    sparse_core_shard_rotation: int
    total_rows_per_sparse_core_shard: int
    per_sparse_core_batch_size: int
    num_features: int


@dataclasses.dataclass
class _Stack:
    tables: list
    height: int = 0
    activation_bytes: int = 0
    variable_bytes: int = 0


class ReferenceStacker:
    def __init__(self, num_partitions, sparse_cores_per_partition, disable_table_stacking=False,
                 activation_mem_bytes_limit=ACTIVATION_MEM_BYTES_LIMIT,
                 variable_shard_bytes_limit=VARIABLE_SHARD_BYTES_LIMIT):
        self.C = num_partitions
        self.S = sparse_cores_per_partition
        self.N = num_partitions * sparse_cores_per_partition
        self.stacking = not disable_table_stacking
        self.act_limit = activation_mem_bytes_limit
        self.var_limit = variable_shard_bytes_limit
        self.stacks = {}  # (padded_width, group) -> [ _Stack ] in creation order

    def add_table(self, name, height, width, group, output_samples, num_features=1):
        samples_per_sc = output_samples // self.S
        padded_width = round_up(width, XLA_PAD)
        padded_height = round_up(height, self.N * XLA_PAD)
        activation_bytes = 4 * padded_width * samples_per_sc
        variable_bytes = 4 * padded_width * padded_height // self.C
        candidates = self.stacks.setdefault((padded_width, group), [])
        target = None
        if self.stacking:
            for stack in candidates:
                if (len(stack.tables) < TABLE_LIMIT
                        and (self.act_limit == 0
                             or stack.activation_bytes + activation_bytes < self.act_limit)
                        and (self.var_limit == 0
                             or stack.variable_bytes + variable_bytes < self.var_limit)
                        and stack.height + padded_height < ROW_LIMIT):
                    target = stack
                    break
        if target is None:
            target = _Stack(tables=[])
            candidates.append(target)
        k = len(target.tables)
        target.tables.append(RefLayout(
            table_name=name, stacked_table_name="", num_sparse_cores=self.N,
            num_partitions=self.C, height=height, width=width, padded_height=padded_height,
            padded_width=padded_width, sparse_core_shard_row_offset=target.height // self.N,
            sparse_core_shard_rotation=(k * self.N // self.C) % self.N,
            total_rows_per_sparse_core_shard=0, per_sparse_core_batch_size=samples_per_sc,
            num_features=num_features))
        target.height += padded_height
        target.activation_bytes += activation_bytes
        target.variable_bytes += variable_bytes

    def get_layouts(self):
        out = []
        for key in sorted(self.stacks):
            for stack in self.stacks[key]:
                name = "_".join(t.table_name for t in stack.tables)
                for t in stack.tables:
                    out.append(dataclasses.replace(
                        t, stacked_table_name=name,
                        total_rows_per_sparse_core_shard=stack.height // self.N))
        return out


# --------------------------------------------------------------------------------------------
# docs/layout.md#mod-sharding logical row -> storage
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Storage:
    shard: int              # SparseCore s
    row_in_shard: int       # l
    stacked_row: int        # s * R + l in the full stacked variable
    partition: int          # device / chip
    row_in_partition: int   # (s mod S_p) * R + l


def logical_to_storage(r, layout):
    n = layout.num_sparse_cores
    R = layout.total_rows_per_sparse_core_shard
    s_p = n // layout.num_partitions
    shard = (r + layout.sparse_core_shard_rotation) % n
    row = layout.sparse_core_shard_row_offset + r // n
    return Storage(shard, row, shard * R + row, shard // s_p, (shard % s_p) * R + row)


def col_id(r, layout):
    """Host col id c = ((r + col_shift) AND (N-1)) + (r AND NOT(N-1)) + col_offset (docs/layout.md#mod-sharding, docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform)."""
    n = layout.num_sparse_cores
    col_offset = layout.sparse_core_shard_row_offset * n
    return ((r + layout.sparse_core_shard_rotation) & (n - 1)) + (r & ~(n - 1)) + col_offset


def unshuffle_from_sc_to_cpu(t, num_sparse_cores, offset, size, rotation):
    """docs/layout.md#mod-sharding: stacked [N * R, dim] -> one table's [size * N, dim] in logical row order."""
    t = np.asarray(t)
    n = num_sparse_cores
    x = t.reshape(n, -1, t.shape[-1])[:, offset:offset + size, :]
    x = np.roll(x, -rotation, axis=0)
    return x.transpose(1, 0, 2).reshape(size * n, t.shape[-1])


def shard_tables(tables, layouts):
    """Builds the full stacked variable [N * R, padded_width] of one stack from unpadded tables.

    `tables[name]` is [height, width]; padding rows/columns are zero (docs/layout.md#mod-sharding step 1).
    """
    first = layouts[0]
    n, R, dim = first.num_sparse_cores, first.total_rows_per_sparse_core_shard, first.padded_width
    dtype = np.asarray(next(iter(tables.values()))).dtype
    out = np.zeros((n * R, dim), dtype=dtype)
    for layout in layouts:
        t = np.asarray(tables[layout.table_name])
        for r in range(t.shape[0]):
            out[logical_to_storage(r, layout).stacked_row, :t.shape[1]] = t[r]
    return out
