"""Backward sparse-dense matmul fused with an optimizer update (docs/optimizers.md#fused-backward-pass).

One Python function per optimizer, generated from the optimizer definitions compiled into the op
library (cc/core/optimizers.h), with TensorFlow's argument order:
(row_pointers, sorted_sample_ids, sorted_token_ids, sorted_gains, activation_gradients,
learning_rate, embedding_table, *slots, num_minibatches_per_physical_sparse_core,
*hyperparameters, table_name, clip_weight_min, clip_weight_max, num_sparsecores_per_device).

Given tensors, a function returns the updated table and slots (TensorFlow's functional form).
Slots have the table's shape, except row-wise ones (`OptimizerDefinition.row_wise_slots`, e.g.
row-wise Adagrad's accumulator), which are [table rows, 1]. Row-wise Adagrad, which TensorFlow does
not have, also takes `embedding_dim`: how many leading columns of a (padded) row are the embedding.

16-bit tables (in-place form only): the table variable may hold bfloat16 or float16 rows. The
update then needs the keyword-only `rounding_seeds`, `rounding_row_offsets` and
`rounding_rotations` (per member table of the stacked table, in row-offset order), which give each
row its logical id, `rounding_step` (the update step) and `rounding` ("stochastic" or "nearest");
see docs/optimizers.md#storage-precision.
Given resource variables, it updates only the touched rows of the variables in place and returns
None eagerly (the op in graph mode): the cost of a step does not grow with the vocabulary.

Delta tracking (in-place form only, keyword-only `touched_flags`; docs/deltas.md): a uint8
variable with one flag per table row, in which the update sets the flag of every row it writes
(cc/core/touched_rows.h), checked before any write.

Keyword-only extras for data-parallel training: `num_replica` (replicas whose SparseCores shard
the table), `num_source_replicas` (how many replicas' CSR buffers and activation gradients are
concatenated in the inputs; their contributions to a row are summed before the single update), and
`first_local_shard` / `num_local_shards` (the shards this table variable holds).

Gradient order (in-place form only, keyword-only `feature_rows_per_sc`; docs/optimizers.md#gradient-order):
with the lookup's `feature_rows_per_sc`, `activation_gradients` is in the order that lookup wrote
the activations, either as one tensor or as a list with one tensor per feature (feature f's
gradient of shape [num_source_replicas * num_sparsecores_per_device * feature_rows_per_sc[f],
width]), so a stacked table's per-feature gradients need no concatenation.

Non-finite gradients (keyword-only `non_finite_gradients`):

* "error" (the default): if any activation gradient row or gain that contributes to a row of this
  table holds a NaN or +-Inf, the step fails with InvalidArgumentError naming the table (and the
  gradient row and table row) and writes nothing: the table and every slot stay bit-identical.
* "skip": the table rows such contributions touch are left unchanged (table and slots); every
  other row is updated as usual. The number of skipped rows is the op's last output,
  `num_skipped_rows` (int32 scalar), and is logged as a warning, like `num_dropped_ids` of the
  CSR ops. Pass `return_num_skipped_rows=True` to get it: the functional form then returns
  `(updated_table_and_slots, num_skipped_rows)`, the in-place form returns `num_skipped_rows`.

Finite inputs give bit-identical results in both modes; the check is one vectorized pass over the
gradients and gains before any write.

The in-place form rejects the same variable passed twice (e.g. as the table and a slot) with
InvalidArgumentError naming the table, as the update would read its own writes.
"""
import dataclasses
import inspect
import math
import re

import tensorflow as tf

from tf_sc_embedding import _core
from tf_sc_embedding._library import library as _lib
from tf_sc_embedding.ops._variables import handle_of, is_variable

_CSR_ARGS = ("row_pointers", "sorted_sample_ids", "sorted_token_ids", "sorted_gains",
             "activation_gradients", "learning_rate", "embedding_table")


@dataclasses.dataclass(frozen=True)
class OptimizerDefinition:
    """What the op library knows about one optimizer."""
    name: str                   # e.g. "adagrad_momentum"
    op_name: str                # e.g. "AdagradMomentum"
    slots: tuple                # op argument names of the slot variables, in order
    hyperparameters: tuple      # ((attr name, "float" | "bool" | "row_width"), ...); a
                                # "row_width" is an int: the embedding's columns in a padded row
    row_wise_slots: tuple = ()  # per slot: True if it holds one float per table row

    @property
    def python_op_suffix(self):
        return re.sub(r"(?<!^)(?=[A-Z])", "_", self.op_name).lower()

    def slot_width(self, slot, width):
        """Columns of a slot of a table `width` columns wide: `width`, or 1 for a row-wise slot
        (the one rule, SlotRowWidth in cc/core/optimizers.h, called through the core module)."""
        return _core.slot_row_width(self.row_wise_slots[self.slots.index(slot)], int(width))


OPTIMIZERS = {
    d["name"]: OptimizerDefinition(d["name"], d["op_name"], tuple(d["slots"]),
                                   tuple(tuple(h) for h in d["hyperparameters"]),
                                   tuple(bool(r) for r in d["row_wise_slots"]))
    for d in _core.optimizer_definitions()
}


def _signature(definition):
    P = inspect.Parameter
    names = (list(_CSR_ARGS) + list(definition.slots) +
             ["num_minibatches_per_physical_sparse_core"] +
             [h for h, _ in definition.hyperparameters] + ["table_name"])
    params = [P(n, P.POSITIONAL_OR_KEYWORD) for n in names]
    params += [P("clip_weight_min", P.POSITIONAL_OR_KEYWORD, default=-math.inf),
               P("clip_weight_max", P.POSITIONAL_OR_KEYWORD, default=math.inf),
               P("num_sparsecores_per_device", P.POSITIONAL_OR_KEYWORD, default=-1),
               P("num_replica", P.KEYWORD_ONLY, default=1),
               P("num_source_replicas", P.KEYWORD_ONLY, default=1),
               P("first_local_shard", P.KEYWORD_ONLY, default=0),
               P("num_local_shards", P.KEYWORD_ONLY, default=-1),
               P("feature_rows_per_sc", P.KEYWORD_ONLY, default=()),
               P("non_finite_gradients", P.KEYWORD_ONLY, default="error"),
               P("rounding_step", P.KEYWORD_ONLY, default=0),
               P("rounding_seeds", P.KEYWORD_ONLY, default=()),
               P("rounding_row_offsets", P.KEYWORD_ONLY, default=()),
               P("rounding_rotations", P.KEYWORD_ONLY, default=()),
               P("rounding", P.KEYWORD_ONLY, default="stochastic"),
               P("touched_flags", P.KEYWORD_ONLY, default=None),
               P("return_num_skipped_rows", P.KEYWORD_ONLY, default=False),
               P("name", P.KEYWORD_ONLY, default=None)]
    return inspect.Signature(params)


def _make_op_function(definition):
    signature = _signature(definition)
    suffix = definition.python_op_suffix
    functional = getattr(_lib, f"sce_xla_sparse_dense_matmul_grad_with_{suffix}_and_csr_input")
    in_place = getattr(_lib, f"sce_resource_sparse_dense_matmul_grad_with_{suffix}_and_csr_input")
    variables = ("embedding_table",) + definition.slots

    def op_function(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        return_count = bool(arguments.pop("return_num_skipped_rows"))
        if arguments["non_finite_gradients"] not in ("error", "skip"):
            raise ValueError(f"table '{arguments['table_name']}': non_finite_gradients must be "
                             f"'error' or 'skip', got {arguments['non_finite_gradients']!r}")
        kinds = {is_variable(arguments[v]) for v in variables}
        if len(kinds) != 1:
            raise TypeError(f"table '{arguments['table_name']}': pass the embedding table and all "
                            f"slots ({', '.join(definition.slots) or 'none'}) either as resource "
                            "variables (in-place update) or as tensors (functional form), not mixed")
        gradients = arguments["activation_gradients"]
        if kinds == {True}:
            for v in variables:
                arguments[v] = handle_of(arguments[v])
            arguments["activation_gradients"] = (list(gradients)
                                                 if isinstance(gradients, (list, tuple))
                                                 else [gradients])
            arguments["feature_rows_per_sc"] = [int(r) for r in arguments["feature_rows_per_sc"]]
            arguments["rounding_step"] = tf.cast(arguments["rounding_step"], tf.int64)
            flags = arguments.pop("touched_flags")
            arguments["touched"] = [] if flags is None else [handle_of(flags)]
            for key in ("rounding_seeds", "rounding_row_offsets", "rounding_rotations"):
                arguments[key] = [int(v) for v in arguments[key]]
            num_skipped = in_place(**arguments)
            if return_count:
                return num_skipped
            # As before the count output existed: None eagerly, the update op in a graph.
            return None if tf.executing_eagerly() else num_skipped.op
        if isinstance(gradients, (list, tuple)) or len(arguments.pop("feature_rows_per_sc")):
            raise ValueError(f"table '{arguments['table_name']}': per-feature activation_gradients "
                             "and feature_rows_per_sc need the in-place form (resource "
                             "variables); the functional form keeps TensorFlow's signature")
        if arguments.pop("touched_flags") is not None:
            raise ValueError(f"table '{arguments['table_name']}': touched_flags needs the "
                             "in-place form (resource variables)")
        if (arguments.pop("rounding_seeds") or arguments.pop("rounding_row_offsets") or
                arguments.pop("rounding_rotations")):
            raise ValueError(f"table '{arguments['table_name']}': 16-bit tables need the in-place "
                             "form (resource variables)")
        for key in ("rounding_row_offsets", "rounding_rotations", "rounding_step", "rounding"):
            arguments.pop(key, None)
        outputs = functional(**arguments)
        updated, num_skipped = outputs[:-1], outputs[-1]
        updated = updated[0] if len(updated) == 1 else list(updated)
        return (updated, num_skipped) if return_count else updated

    op_function.__name__ = f"xla_sparse_dense_matmul_grad_with_{suffix}_and_csr_input"
    op_function.__signature__ = signature
    op_function.__doc__ = (
        f"Fused backward pass and {definition.op_name} update; see the module docstring for the "
        "argument order and the two forms.\n\n"
        "non_finite_gradients: 'error' (default) fails the step with InvalidArgumentError naming "
        "the table when a NaN/Inf gradient or gain contributes to a row, writing nothing; 'skip' "
        "leaves the rows such contributions touch unchanged (table and slots) and counts them.\n"
        "return_num_skipped_rows: also return that count (int32 scalar): "
        "(updated_table_and_slots, num_skipped_rows) for tensors, num_skipped_rows for "
        "variables.\n"
        "The in-place form rejects one variable passed twice (InvalidArgumentError).")
    return op_function


_FUNCTIONS = {d.name: _make_op_function(d) for d in OPTIMIZERS.values()}
xla_sparse_dense_matmul_grad_with_sgd_and_csr_input = _FUNCTIONS["sgd"]
xla_sparse_dense_matmul_grad_with_adagrad_and_csr_input = _FUNCTIONS["adagrad"]
xla_sparse_dense_matmul_grad_with_row_wise_adagrad_and_csr_input = _FUNCTIONS["row_wise_adagrad"]
xla_sparse_dense_matmul_grad_with_adagrad_momentum_and_csr_input = _FUNCTIONS["adagrad_momentum"]
xla_sparse_dense_matmul_grad_with_adam_and_csr_input = _FUNCTIONS["adam"]
xla_sparse_dense_matmul_grad_with_ftrl_and_csr_input = _FUNCTIONS["ftrl"]


def fused_update_function(optimizer_name):
    """The op function of an optimizer definition, by name."""
    return _FUNCTIONS[optimizer_name]
