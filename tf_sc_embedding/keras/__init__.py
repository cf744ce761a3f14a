"""Keras on top of the embedding: the layer (`layer`), its weight files (`weights`), its config
(`config`) and padding of short batches (`batch_padding`). Nothing else in the package imports it."""
