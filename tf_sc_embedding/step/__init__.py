"""One training step over the plan's exchanges: enqueue, dequeue, apply_gradients and the
non-finite policy (`embedding_step`), an update kept for the next step (`pipelining`), the next
batch's lookup run early (`prefetch`)."""
