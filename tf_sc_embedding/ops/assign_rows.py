"""Whole rows of a table or slot variable written in place (cc/ops/assign_rows_ops.cc).

An open-vocabulary table resets the rows it gives to new keys, and its scratch row, in every step
(docs/dynamic_vocabulary.md#in-the-training-step). TensorFlow's scatter ops would do it, but they
switch the variable to copy-on-read mode, after which every dense read copies the whole table.
"""
from tf_sc_embedding._library import library as _lib


def assign_rows(variable, rows, values, table_name, name=None):
    """variable[rows[i], :w] = values[i] (a repeated row takes its last values; 16-bit variables
    round to nearest). rows: [k] int32; values: [k, w] float32, w at most the variable's width.
    A row outside the variable fails with InvalidArgument naming `table_name`, writing nothing."""
    return _lib.sce_assign_rows(variable=variable.handle, rows=rows, values=values,
                                table_name=table_name, name=name)
