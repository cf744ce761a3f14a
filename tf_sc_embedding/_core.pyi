"""Type stub of `tf_sc_embedding._core`, the pybind11 module built from cc/python/core_pybind.cc.

The TensorFlow-free pieces Python needs at construction time: the table layout stacker
(docs/layout.md#table-layout), the optimizer definitions that slot creation is derived from, the
minibatch split encoding (docs/preprocessing.md#split-encoding) and the constants of cc/core.
Keep it in step with core_pybind.cc (tests/api/test_core_stub.py compares the two).
"""
from typing import Dict, List, Sequence, Tuple, Union

# Bounds every op checks its attributes against (cc/core/checked_math.h).
MAX_SPARSE_CORES_PER_CHIP: int
MAX_REPLICAS: int
MAX_SHARDS: int
MAX_ALLOCATION_ELEMENTS: int
# Defaults shared by every layer (cc/core/constants.h) and the largest division level
# (cc/core/split_encoding.h).
DEFAULT_SPARSE_CORES_PER_REPLICA: int
DEFAULT_MAX_DIVISION_LEVEL: int
MAX_DIVISION_LEVEL: int


class TableLayout:
    """Where one table sits in its stacked table (read-only)."""

    @property
    def table_name(self) -> str: ...
    @property
    def stacked_table_name(self) -> str: ...
    @property
    def num_sparse_cores(self) -> int: ...
    @property
    def num_partitions(self) -> int: ...
    @property
    def height(self) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def padded_height(self) -> int: ...
    @property
    def padded_width(self) -> int: ...
    @property
    def sparse_core_shard_row_offset(self) -> int: ...
    @property
    def sparse_core_shard_rotation(self) -> int: ...
    @property
    def total_rows_per_sparse_core_shard(self) -> int: ...
    @property
    def per_sparse_core_batch_size(self) -> int: ...
    @property
    def num_features(self) -> int: ...


class LayoutStacker:
    """Rounds tables and stacks them (ValueError for impossible configurations)."""

    def __init__(self, num_partitions: int, sparse_cores_per_partition: int,
                 disable_table_stacking: bool = ..., activation_mem_bytes_limit: int = ...,
                 variable_shard_bytes_limit: int = ...) -> None: ...
    def add_table(self, name: str, height: int, width: int, group: str, output_samples: int,
                  num_features: int = 1) -> None: ...
    def get_layouts(self) -> List[TableLayout]: ...


def slot_row_width(row_wise: bool, width: int) -> int:
    """Floats per row of an optimizer slot for a table `width` wide (1 if row-wise)."""

def optimizer_definitions() -> List[Dict[str, Union[str, List[str], List[Tuple[str, str]]]]]:
    """One dict per optimizer of cc/core/optimizers.h: name, op_name, slots (op input names, in
    order), row_wise_slots (per slot: one float per row?) and hyperparameters ((attribute name,
    "float" | "bool" | "row_width"), ...)."""


def binary_to_bucket_splits(bits: int, max_division_level: int = ...) -> List[int]: ...


def bucket_splits_to_binary(splits: Sequence[int], max_division_level: int = ...) -> int: ...
