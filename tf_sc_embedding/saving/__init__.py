"""What leaves training: TensorFlow-compatible, topology-free checkpoints (`checkpointing`) and the
serving SavedModel of stock ops (`serving`, with its row encodings in `serving_rows`)."""
