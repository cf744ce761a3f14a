"""Tells resource variables (updated in place) from plain tensors (functional form)."""
import tensorflow as tf


def is_variable(x):
    return isinstance(x, tf.Variable) and hasattr(x, "handle")


def handle_of(x):
    return x.handle
