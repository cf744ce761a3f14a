"""The main job's `--delta-every N`: a live serving model and the deltas that keep it fresh.

After the first training batch the job exports a serving model (`<output>/serving_live`, the
DLRM SavedModel with the tables as they are then), and every N batches it writes a delta of the
rows trained since (`<output>/deltas`, docs/deltas.md), in the background while training goes
on, with the small dense MLPs' weights whole beside it (`dense-<sequence>.npz`). `examples/serve_deltas.py` watches that folder, applies each delta to the live model as it
appears and reports its held-out AUC. The job marks the end of the stream with
`<output>/deltas/FINISHED` once its last delta is written.
"""
import os

import numpy as np

FINISHED = "FINISHED"


def live_serving_dir(output_dir):
    return os.path.join(output_dir, "serving_live")


def deltas_dir(output_dir):
    return os.path.join(output_dir, "deltas")


def dense_file(sequence):
    """The dense weights written with the job's delta `sequence` (its run's numbering)."""
    return f"dense-{int(sequence):08d}.npz"


def delta_exports(model, output_dir, every, export_serving, dense_variables):
    """A Keras callback: export_serving(export_dir) after the first batch, then a delta of
    `model.sparse.embedding` every `every` batches and at the end of training, each with the
    dense weights (dense_variables(model): the variables, in the serving model's order)."""
    import keras  # pylint: disable=import-outside-toplevel

    class DeltaExports(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.batches, self.pending, self.written = 0, None, 0

        def on_train_begin(self, logs=None):
            os.makedirs(deltas_dir(output_dir), exist_ok=True)
            marker = os.path.join(deltas_dir(output_dir), FINISHED)
            if os.path.exists(marker):
                os.remove(marker)

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1
            if self.batches == 1:
                export_serving(live_serving_dir(output_dir))
            elif self.batches % every == 0:
                self._write()

        def _write(self):
            if self.pending is not None:
                self.pending.result()   # one delta at a time: they are written in order
            self.pending = model.sparse.embedding.export_delta(deltas_dir(output_dir),
                                                               blocking=False)
            self.written += 1
            # The dense MLPs are small: they go whole, beside the delta of the same sequence.
            weights = {f"w{i}": v.numpy() for i, v in enumerate(dense_variables(model))}
            np.savez(os.path.join(deltas_dir(output_dir), dense_file(self.written)), **weights)

        def on_train_end(self, logs=None):
            if self.batches % every:
                self._write()
            if self.pending is not None:
                self.pending.result()
            with open(os.path.join(deltas_dir(output_dir), FINISHED), "w") as f:
                f.write(f"{self.written}\n")

    return DeltaExports()
