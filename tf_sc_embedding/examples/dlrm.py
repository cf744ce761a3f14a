"""The main job: train a DLRM-style click model with tf_sc_embedding and Keras, end to end.

    python -m tf_sc_embedding.examples.dlrm [--steps 600] [--batch-size 1024] [--replicas 1] ...

Data: by default the built-in Criteo-like workload (26 multi-hot categorical features,
Zipf-distributed ids, vocabularies scaled by --vocabulary-scale) plus 13 dense features, labelled
by a hidden teacher model over the same ids (`tf_sc_embedding.data.teacher`), so there is real
signal to learn. With --data, real click logs in the public Criteo format (plain or gzip files,
streamed; `tf_sc_embedding.data.criteo_files`): categorical values are hashed into tables of the
same sizes, integer features become log(1 + max(x, 0)); the held-out part is --eval-data or a
deterministic hash split (--eval-fraction) of the --data lines.
Model (DLRM): one embedding table per categorical feature (an `EmbeddingLayer` owning a
`TPUEmbeddingV2`, mean combiner), a bottom MLP on the dense features, pairwise dot-product
interactions of the 27 vectors, a top MLP and a logit. `model.fit` trains the MLPs with the Keras
optimizer (--dense-optimizer) and the tables with their own fused optimizer (--optimizer).
Then: held-out AUC and log loss (`model.evaluate`), a `tf.train.Checkpoint` of the model, and a
serving SavedModel (stock TensorFlow ops only: the logical tables from
`tf_sc_embedding.saving.serving`, the MLPs) that maps raw ids and dense features to a click probability.
Everything is written under --output-dir; with --logdir also TensorBoard scalars (training
loss, held-out AUC and log loss, both learning rates).
"""
import argparse
import json
import os
import sys
import time

# TensorFlow reads its logging variables when it is loaded; `python -m` imports the
# tf_sc_embedding package (and TensorFlow) before this module, so scripts/run.sh sets them itself
# (TF_CPP_MIN_LOG_LEVEL, and TF_ENABLE_ONEDNN_OPTS, whose banner ignores the log level).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

E = None  # tf.tpu.experimental.embedding, set by _import_tf()

TABLE_OPTIMIZERS = ("adagrad", "row_wise_adagrad", "sgd", "adam", "ftrl")
DENSE_OPTIMIZERS = ("adam", "adagrad", "sgd")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m tf_sc_embedding.examples.dlrm",
        description="Train a DLRM-style click model with tf_sc_embedding's Keras EmbeddingLayer "
                    "on the built-in teacher-labelled Criteo-like data (default) or on Criteo "
                    "click-log files (--data); report held-out AUC and log loss, save a "
                    "checkpoint and export a serving SavedModel. A short run: --steps 50 "
                    "--eval-samples 8192.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000,
                        help="training steps (batches)")
    parser.add_argument("--train-samples", type=int, default=1 << 19,
                        help="size of the generated training set; training repeats it when "
                             "steps x batch size is larger (epochs)")
    parser.add_argument("--batch-size", type=int, default=1024,
                        help="global batch size (divisible by replicas x 4 SparseCores)")
    parser.add_argument("--embedding-dim", type=int, default=16,
                        help="embedding dimension of every table (also the bottom MLP's output)")
    parser.add_argument("--optimizer", choices=TABLE_OPTIMIZERS, default="adagrad",
                        help="fused per-table optimizer of the embedding tables")
    parser.add_argument("--table-dtype", choices=("float32", "bfloat16", "float16"),
                        default="float32",
                        help="storage dtype of the tables' rows (16-bit rows are updated in "
                             "float32 and written back rounded)")
    parser.add_argument("--table-rounding", choices=("stochastic", "nearest"),
                        default="stochastic",
                        help="how 16-bit rows are written back (nearest: for comparison)")
    parser.add_argument("--learning-rate", type=float, default=None,
                        help="learning rate of the table optimizer (default: 0.5 for adagrad "
                             "and row_wise_adagrad, 2.0 for sgd, 0.01 for adam, 0.5 for ftrl)")
    parser.add_argument("--dense-optimizer", choices=DENSE_OPTIMIZERS, default="adam",
                        help="Keras optimizer of the MLPs")
    parser.add_argument("--dense-learning-rate", type=float, default=0.001,
                        help="learning rate of the Keras optimizer")
    parser.add_argument("--replicas", type=int, default=1,
                        help="data-parallel replicas (MirroredStrategy over logical CPU devices)")
    parser.add_argument("--output-dir", default="out",
                        help="directory for the checkpoint, the serving export and metrics.json "
                             "(nothing is written elsewhere)")
    parser.add_argument("--vocabulary-scale", type=float, default=0.01,
                        help="fraction of the Criteo-like vocabulary sizes (1.0 = 18.8M rows)")
    parser.add_argument("--eval-samples", type=int, default=65536,
                        help="held-out samples for AUC and log loss")
    parser.add_argument("--preprocess-in-data", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="run the embedding's host preprocessing (enqueue) inside the "
                             "tf.data pipeline, ahead of the step (EmbeddingLayer.preprocess + "
                             "prefetch); --no-preprocess-in-data preprocesses in the step")
    parser.add_argument("--pipelining", action="store_true",
                        help="pipeline_execution_with_tensor_core=True: the tables' update "
                             "overlaps the next step's dense work, one step stale "
                             "(docs/pipelining.md)")
    parser.add_argument("--freeze-tables", action="store_true",
                        help="keep the tables at their random initial values (baseline: only the "
                             "MLPs train)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the model")
    parser.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                        help="Keras verbosity (1: progress bar)")
    parser.add_argument("--no-export", action="store_true",
                        help="skip the checkpoint and the serving export")
    parser.add_argument("--serving-quantize", choices=("none", "int8"), default="none",
                        help="store the serving export's tables as float32 (none) or as int8 "
                             "rows with a per-row scale and offset")
    parser.add_argument("--delta-every", type=int, default=0, metavar="N",
                        help="export a live serving model after the first batch and a delta "
                             "of the rows trained every N batches (OUTPUT_DIR/serving_live, "
                             "OUTPUT_DIR/deltas; examples/serve_deltas.py applies them)")
    data = parser.add_argument_group(
        "real data", "Criteo click logs: tab-separated label, I1-I13, C1-C26 per line (any field "
        "but the label may be empty), plain or gzip. Categorical values are hashed into tables "
        "of the --vocabulary-scale sizes (row 0 of each table is reserved for an empty value); "
        "integer features become log(1 + max(x, 0)), empty -> 0.")
    data.add_argument("--data", nargs="+", metavar="PATH",
                      help="training files or glob patterns (read in the given order, streamed, "
                           "repeated when --steps needs more lines); without --data the built-in "
                           "synthetic data is used")
    data.add_argument("--eval-data", nargs="+", metavar="PATH",
                      help="held-out files or globs; without them, lines of --data whose hash "
                           "falls in --eval-fraction are held out (and never trained on)")
    data.add_argument("--raw-keys", action="store_true",
                      help="train the categorical values as raw string keys in open-vocabulary "
                           "tables (dynamic_vocabularies) holding the same numbers of rows, "
                           "instead of hashing them (docs/dynamic_vocabulary.md)")
    data.add_argument("--admission-threshold", type=int, default=2,
                      help="with --raw-keys: occurrences a key needs before it gets a row (the "
                           "DLRM reference drops values seen fewer times)")
    data.add_argument("--eval-fraction", type=float, default=0.1,
                      help="fraction of the --data lines held out when --eval-data is not given")
    data.add_argument("--shuffle-buffer", type=int, default=0,
                      help="shuffle training lines in a buffer of this many lines (0: file order)")
    logs = parser.add_argument_group("TensorBoard")
    logs.add_argument("--logdir", metavar="DIR",
                      help="write TensorBoard scalars here (train/: loss, learning rates; "
                           "eval/: AUC, log loss); view with `tensorboard --logdir DIR`")
    logs.add_argument("--log-every", type=int, default=20,
                      help="steps between training scalars")
    logs.add_argument("--eval-every", type=int, default=0,
                      help="also evaluate the held-out data every this many steps (must divide "
                           "--steps; Keras then shows one progress bar per interval); 0: only "
                           "after training")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.embedding_dim < 1 or args.replicas < 1:
        parser.error("--steps, --batch-size, --embedding-dim and --replicas must be positive")
    if args.batch_size % (4 * args.replicas):
        parser.error(f"--batch-size {args.batch_size} must be divisible by replicas x 4 "
                     f"SparseCores = {4 * args.replicas}")
    if args.eval_data and not args.data:
        parser.error("--eval-data needs --data")
    if args.raw_keys and not args.data:
        parser.error("--raw-keys needs --data (the built-in data have integer ids)")
    if args.admission_threshold < 1:
        parser.error("--admission-threshold must be at least 1")
    if args.data:
        from tf_sc_embedding.data.criteo_files import expand_paths  # pylint: disable=import-outside-toplevel
        try:
            args.data_files = expand_paths(args.data)
            args.eval_data_files = expand_paths(args.eval_data) if args.eval_data else None
        except FileNotFoundError as error:
            parser.error(str(error))
    if not 0 < args.eval_fraction < 1:
        parser.error("--eval-fraction must be between 0 and 1")
    if args.log_every < 1:
        parser.error("--log-every must be positive")
    if args.eval_every < 0 or (args.eval_every and args.steps % args.eval_every):
        parser.error(f"--eval-every must divide --steps ({args.steps})")
    if args.eval_samples < args.batch_size:
        parser.error("--eval-samples must be at least one batch")
    return args


def _import_tf(replicas=1):
    """Imports TensorFlow, configuring `replicas` logical CPU devices first if needed."""
    global E
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if replicas > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * max(
                    replicas, len(tf.config.get_logical_device_configuration(cpu) or [])))
        except RuntimeError:
            pass   # already initialized (e.g. configured by the caller)
        if len(tf.config.list_logical_devices("CPU")) < replicas:
            raise RuntimeError(f"--replicas {replicas} needs {replicas} logical CPU devices but "
                               "TensorFlow was initialized with fewer")
    E = tf.tpu.experimental.embedding
    return tf


def make_strategy(replicas):
    tf = _import_tf(replicas)
    if replicas == 1:
        return tf.distribute.get_strategy()
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])


def table_optimizer(name, learning_rate=None):
    _import_tf()
    defaults = {"adagrad": 0.5, "row_wise_adagrad": 0.5, "sgd": 2.0, "adam": 0.01, "ftrl": 0.5}
    lr = defaults[name] if learning_rate is None else learning_rate
    import tf_sc_embedding as sce  # pylint: disable=import-outside-toplevel
    return {"adagrad": lambda: E.Adagrad(learning_rate=lr),
            "row_wise_adagrad": lambda: sce.RowWiseAdagrad(learning_rate=lr),
            "sgd": lambda: E.SGD(learning_rate=lr),
            "adam": lambda: E.Adam(learning_rate=lr),
            "ftrl": lambda: E.FTRL(learning_rate=lr)}[name]()


def keras_optimizer(name, learning_rate):
    import keras  # pylint: disable=import-outside-toplevel
    return {"adam": keras.optimizers.Adam, "adagrad": keras.optimizers.Adagrad,
            "sgd": keras.optimizers.SGD}[name](learning_rate=learning_rate)


# ----------------------------------------------------------------------------------- data
def make_dataset(split, batch_size, feature_names, repeat=False):
    """tf.data of ({"dense": [B, 13], "ids": {name: ragged [B, None] int32}}, labels [B, 1]).

    Batches are full (the tail of the split that does not fill a batch is dropped).
    """
    tf = _import_tf()
    num_batches = len(split) // batch_size
    n = num_batches * batch_size
    ids = {}
    for name, splits, values in zip(feature_names, split.row_splits, split.ids):
        ragged = tf.RaggedTensor.from_row_splits(values[:splits[n]], splits[:n + 1])
        ids[name] = tf.RaggedTensor.from_uniform_row_length(ragged, batch_size)
    dense = split.dense[:n].reshape(num_batches, batch_size, -1)
    labels = split.labels[:n].reshape(num_batches, batch_size, 1)
    dataset = tf.data.Dataset.from_tensor_slices(({"dense": dense, "ids": ids}, labels))
    if repeat:
        dataset = dataset.repeat()
    return dataset.prefetch(4)


def preprocessed_dataset(dataset, layer, batch_size, strategy, prefetch=4):
    """The recipe of docs/training_loop.md#preprocessing-ahead-of-the-step, for `fit` / `evaluate`.

    Every global batch ({"dense", "ids"}, labels) of `batch_size` samples becomes one element per
    replica, in replica order, whose ids are that replica's slice preprocessed by
    `layer.preprocess` inside tf.data (so the work runs in tf.data's threads ahead of the step).
    With several replicas the result is a distributed dataset: its one input pipeline hands the
    elements to the replicas in turn.
    """
    tf = _import_tf()
    replicas = strategy.num_replicas_in_sync
    per_replica = batch_size // replicas

    def one_replica(features, labels, r):
        def part(t):
            return t[r * per_replica:(r + 1) * per_replica]
        ids = {name: part(value) for name, value in features["ids"].items()}
        return ({"dense": part(features["dense"]), "ids": layer.preprocess(ids)}, part(labels))

    if replicas == 1:
        return dataset.map(lambda f, y: one_replica(f, y, 0)).prefetch(prefetch)

    def split(features, labels):
        result = tf.data.Dataset.from_tensors(one_replica(features, labels, 0))
        for r in range(1, replicas):
            result = result.concatenate(
                tf.data.Dataset.from_tensors(one_replica(features, labels, r)))
        return result

    local = dataset.flat_map(split).prefetch(prefetch)
    return strategy.distribute_datasets_from_function(lambda _: local)


# ----------------------------------------------------------------------------------- models
def feature_config(vocabulary_sizes, feature_names, dim, seed=0):
    """One mean-combined table per categorical feature, seeded truncated-normal initial rows."""
    tf = _import_tf()
    features = {}
    for i, (name, vocabulary) in enumerate(zip(feature_names, vocabulary_sizes)):
        table = E.TableConfig(
            vocabulary_size=vocabulary, dim=dim, combiner="mean", name=f"table_{name}",
            initializer=tf.initializers.TruncatedNormal(stddev=1 / np.sqrt(dim), seed=seed + i))
        features[name] = E.FeatureConfig(table=table, name=name)
    return features


def _dlrm_class():
    import keras  # pylint: disable=import-outside-toplevel
    tf = _import_tf()

    class DLRM(keras.Model):
        """Bottom MLP + embeddings -> pairwise dot interactions -> top MLP -> logit.

        `sparse` is any layer mapping {"name": ids} to {"name": [batch, dim]} activations (the
        tf_sc_embedding `EmbeddingLayer`, or `KerasEmbeddingTables` for the benchmark baseline).
        """

        def __init__(self, sparse, feature_names, dim, bottom=(64,), top=(128, 64), seed=0,
                     **kwargs):
            super().__init__(**kwargs)
            self.sparse = sparse
            self.feature_names = tuple(feature_names)
            init = lambda i: keras.initializers.GlorotUniform(seed=seed * 100 + i)  # noqa: E731
            self.bottom = keras.Sequential(
                [keras.layers.Dense(u, activation="relu", kernel_initializer=init(i))
                 for i, u in enumerate(bottom)] +
                [keras.layers.Dense(dim, activation="relu", kernel_initializer=init(10))],
                name="bottom_mlp")
            self.top = keras.Sequential(
                [keras.layers.Dense(u, activation="relu", kernel_initializer=init(20 + i))
                 for i, u in enumerate(top)] +
                [keras.layers.Dense(1, kernel_initializer=init(30))], name="top_mlp")
            count = len(self.feature_names) + 1
            rows, cols = np.triu_indices(count, 1)
            self._pairs = tf.constant(rows * count + cols, tf.int32)
            self._count = count

        def call(self, inputs, training=None):
            activations = self.sparse(inputs["ids"], training=training)
            return self.interact_and_predict(inputs["dense"], activations)

        def interact_and_predict(self, dense, activations):
            """The dense part of the model: logits from dense features and activations."""
            bottom = self.bottom(dense)
            vectors = tf.stack([bottom] + [activations[n] for n in self.feature_names], axis=1)
            dots = tf.matmul(vectors, vectors, transpose_b=True)
            pairs = tf.gather(tf.reshape(dots, [-1, self._count * self._count]), self._pairs,
                              axis=1)
            return self.top(tf.concat([bottom, pairs], axis=1))

    return DLRM


def _keras_embedding_tables_class():
    import keras  # pylint: disable=import-outside-toplevel
    tf = _import_tf()

    class KerasEmbeddingTables(keras.layers.Layer):
        """Baseline: one `keras.layers.Embedding` per feature, mean over each sample's ids.

        Trained by the model's Keras optimizer like any other weight (what a Keras user writes
        today without tf_sc_embedding).
        """

        def __init__(self, vocabulary_sizes, feature_names, dim, seed=0, **kwargs):
            super().__init__(**kwargs)
            self.feature_names = tuple(feature_names)
            self.tables = [keras.layers.Embedding(
                v, dim, name=f"table_{n}",
                embeddings_initializer=keras.initializers.TruncatedNormal(
                    stddev=1 / np.sqrt(dim), seed=seed + i))
                for i, (n, v) in enumerate(zip(feature_names, vocabulary_sizes))]

        def call(self, ids):
            out = {}
            for name, table in zip(self.feature_names, self.tables):
                ragged = ids[name]
                rows = table(ragged.values)
                out[name] = tf.math.segment_mean(rows, ragged.value_rowids())
                out[name] = tf.ensure_shape(out[name], [None, rows.shape[-1]])
            return out

    return KerasEmbeddingTables


def build_model(data, args, strategy, baseline=False):
    """The DLRM (compiled) under the strategy; baseline=True uses Keras Embedding tables."""
    import keras  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding.keras.layer import EmbeddingLayer  # pylint: disable=import-outside-toplevel
    from tf_sc_embedding import DynamicVocabulary  # pylint: disable=import-outside-toplevel
    tf = _import_tf()
    DLRM = _dlrm_class()
    with strategy.scope():
        if baseline:
            sparse = _keras_embedding_tables_class()(data.vocabulary_sizes, data.feature_names,
                                                     args.embedding_dim, seed=args.seed,
                                                     name="keras_embedding_tables")
        else:
            features = feature_config(data.vocabulary_sizes, data.feature_names,
                                      args.embedding_dim, args.seed)
            tables = {f.table.name for f in features.values()}
            dynamic = ({t: DynamicVocabulary(tf.string, args.admission_threshold)
                        for t in tables} if getattr(args, "raw_keys", False) else {})
            sparse = EmbeddingLayer(
                features, optimizer=table_optimizer(args.optimizer, args.learning_rate),
                batch_size=args.batch_size, name="embedding",
                pipeline_execution_with_tensor_core=args.pipelining,
                table_dtypes={t: args.table_dtype for t in tables},
                table_rounding=args.table_rounding, dynamic_vocabularies=dynamic,
                delta_tracking=getattr(args, "delta_every", 0) > 0)
            if args.freeze_tables:
                sparse.trainable = False
        model = DLRM(sparse, data.feature_names, args.embedding_dim, seed=args.seed,
                     name="dlrm")
        model.compile(
            optimizer=keras_optimizer(args.dense_optimizer, args.dense_learning_rate),
            loss=keras.losses.BinaryCrossentropy(from_logits=True),
            metrics=[keras.metrics.AUC(from_logits=True, num_thresholds=1000, name="auc"),
                     keras.metrics.BinaryCrossentropy(from_logits=True, name="log_loss")],
            jit_compile=False)
    return model


# ----------------------------------------------------------------------------------- serving
def export_serving_model(model, export_dir, dense_features, quantize=None):
    """SavedModel: click probability from raw ids and dense features, stock TensorFlow ops only.

    Signature ``serving_default`` (flat, for TensorFlow Serving): ``dense`` float32 [batch, 13]
    and per feature ``<name>_ids`` int64 [n] (string keys for open-vocabulary tables) /
    ``<name>_row_splits`` int64 [batch + 1]; output ``probability`` [batch]. The loaded object
    also has ``predict(dense, ids)`` with a dict of `tf.RaggedTensor`s, and ``embedding`` (the
    tf_sc_embedding.saving.serving module).
    quantize="int8" stores the tables as int8 rows with a per-row scale and offset.
    """
    tf = _import_tf()
    from tf_sc_embedding.saving import serving  # pylint: disable=import-outside-toplevel
    names = model.feature_names
    lookup = serving.serving_module(model.sparse.embedding, quantize)
    key_dtypes = {n: lookup.key_tables[f"table_{n}"].key_dtype
                  if f"table_{n}" in lookup.key_tables else tf.int64 for n in names}

    class ServingModel(tf.Module):
        def __init__(self):
            super().__init__(name="dlrm_serving")
            self.embedding = lookup
            self.bottom = model.bottom
            self.top = model.top
            # The dense weights in a fixed order, for a serving loop that refreshes them
            # (examples/serve_deltas.py).
            self.dense_variables = dense_variables(model)

        @tf.function(input_signature=[
            tf.TensorSpec([None, dense_features], tf.float32),
            {n: tf.RaggedTensorSpec([None, None], key_dtypes[n], ragged_rank=1)
             for n in names}])
        def predict(self, dense, ids):
            activations = self.embedding.lookup(ids)
            return tf.sigmoid(model.interact_and_predict(dense, activations))[:, 0]

        @tf.function(input_signature=[{
            "dense": tf.TensorSpec([None, dense_features], tf.float32, name="dense"),
            **{f"{n}_ids": tf.TensorSpec([None], key_dtypes[n], name=f"{n}_ids")
               for n in names},
            **{f"{n}_row_splits": tf.TensorSpec([None], tf.int64, name=f"{n}_row_splits")
               for n in names}}])
        def serving_default(self, inputs):
            ids = {n: tf.RaggedTensor.from_row_splits(inputs[f"{n}_ids"],
                                                      inputs[f"{n}_row_splits"])
                   for n in names}
            return {"probability": self.predict(inputs["dense"], ids)}

    module = ServingModel()
    tf.saved_model.save(module, export_dir,
                        signatures={"serving_default": module.serving_default})
    return module


def dense_variables(model):
    """The DLRM's dense weights (TensorFlow variables), bottom then top MLP, in a fixed order."""
    return [w.value for w in list(model.bottom.weights) + list(model.top.weights)]


# ----------------------------------------------------------------------------------- main
class _Throughput:
    """Keras callback timing training batches (after `skip` warm-up batches)."""

    def __new__(cls, batch_size, skip=20):
        import keras  # pylint: disable=import-outside-toplevel

        class Callback(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.batch_size, self.skip = batch_size, skip
                self.count, self.start, self.elapsed = 0, None, None

            def on_train_batch_end(self, batch, logs=None):
                self.count += 1
                if self.count == self.skip:
                    self.start = time.perf_counter()

            def on_train_end(self, logs=None):
                if self.start is not None:
                    self.elapsed = time.perf_counter() - self.start

            @property
            def samples_per_second(self):
                if not self.elapsed:
                    return float("nan")
                return (self.count - self.skip) * self.batch_size / self.elapsed

        return Callback()


class _Summaries:
    """Keras callback writing TensorBoard scalars under `logdir` (see `--logdir`).

    train/: ``loss`` (Keras's running mean of the batch losses since the start of the current
    fit epoch, as the progress bar shows it), ``learning_rate/tables`` and
    ``learning_rate/dense``, every `every` steps and at the last step; eval/: ``auc`` and
    ``log_loss`` on the held-out data, at every validation (--eval-every) and after training.
    The step axis counts training batches. The scalars are written with TensorFlow's own
    `tf.summary.write` and the metadata of TensorBoard's scalar plugin, so writing them does not
    need the tensorboard package (viewing them does).
    """

    def __new__(cls, logdir, every, table_learning_rate):
        import keras  # pylint: disable=import-outside-toplevel
        from tensorflow.core.framework import summary_pb2  # pylint: disable=import-outside-toplevel
        tf = _import_tf()
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
        metadata = metadata.SerializeToString()

        def scalar(tag, value):
            tf.summary.write(tag, tf.constant(value, tf.float32), metadata=metadata)

        class Callback(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.every, self.step, self.last_eval_step = every, 0, None
                self.train_writer = tf.summary.create_file_writer(os.path.join(logdir, "train"))
                self.eval_writer = tf.summary.create_file_writer(os.path.join(logdir, "eval"))
                self._logged_step = None

            def _learning_rates(self):
                table_lr = table_learning_rate
                table_lr = table_lr() if callable(table_lr) else table_lr
                dense_lr = self.model.optimizer.learning_rate
                return (None if table_lr is None else float(np.asarray(table_lr)),
                        float(np.asarray(dense_lr)))

            def _write_train(self, logs):
                table_lr, dense_lr = self._learning_rates()
                with self.train_writer.as_default(step=self.step):
                    if logs and "loss" in logs:
                        scalar("loss", float(logs["loss"]))
                    if table_lr is not None:
                        scalar("learning_rate/tables", table_lr)
                    scalar("learning_rate/dense", dense_lr)
                self._logged_step = self.step

            def on_train_batch_end(self, batch, logs=None):
                self.step += 1
                if self.step % self.every == 0 or self.step == 1:
                    self._write_train(logs)

            def on_epoch_end(self, epoch, logs=None):
                if self._logged_step != self.step:
                    self._write_train(logs)
                if logs and "val_auc" in logs:
                    self.write_eval({"auc": logs["val_auc"], "log_loss": logs["val_log_loss"]})

            def write_eval(self, metrics):
                if self.last_eval_step == self.step:
                    return
                with self.eval_writer.as_default(step=self.step):
                    scalar("auc", float(metrics["auc"]))
                    scalar("log_loss", float(metrics["log_loss"]))
                self.last_eval_step = self.step

            def close(self):
                self.train_writer.close()
                self.eval_writer.close()

        return Callback()


def load_data(args):
    """(data, train dataset, held-out dataset, held-out split or None, seconds to generate).

    `data` has `feature_names` and `vocabulary_sizes`; the held-out split (numpy) exists for the
    built-in synthetic data only.
    """
    from tf_sc_embedding.data.teacher import TeacherLabelledData, scaled_vocabulary_sizes  # pylint: disable=import-outside-toplevel
    tf = _import_tf()
    started = time.time()
    if args.data:
        from tf_sc_embedding.data.criteo_files import CriteoFiles  # pylint: disable=import-outside-toplevel
        data = CriteoFiles(args.data, scaled_vocabulary_sizes(args.vocabulary_scale),
                           eval_patterns=args.eval_data, eval_fraction=args.eval_fraction,
                           raw_keys=args.raw_keys)
        train, test = data.datasets(args.batch_size, shuffle_buffer=args.shuffle_buffer,
                                    seed=args.seed)
        # The held-out batches are read once, kept in memory (evaluated again with --eval-every)
        # and counted, so Keras knows where they end.
        test = test.take(args.eval_samples // args.batch_size).cache()
        data.eval_labels = np.concatenate([y.numpy().reshape(-1) for _, y in test] or
                                          [np.zeros(0, np.float32)])
        if not len(data.eval_labels):
            raise ValueError(f"the held-out data has less than one batch of {args.batch_size} "
                             "samples; give more --data lines, --eval-data or a larger "
                             "--eval-fraction")
        test = test.apply(tf.data.experimental.assert_cardinality(
            len(data.eval_labels) // args.batch_size))
        return data, train, test, None, time.time() - started
    data = TeacherLabelledData(vocabulary_scale=args.vocabulary_scale, seed=args.seed)
    train_split = data.split(min(args.steps * args.batch_size,
                                 max(args.train_samples, args.batch_size)))
    test_split = data.split(args.eval_samples, test=True)
    generated = time.time() - started
    train = make_dataset(train_split, args.batch_size, data.feature_names, repeat=True)
    test = make_dataset(test_split, args.batch_size, data.feature_names)
    return data, train, test, test_split, generated


def train_and_evaluate(args, strategy=None, baseline=False, export=True):
    """Builds the data and the model, fits, evaluates; returns a dict of results."""
    if strategy is None:
        strategy = make_strategy(args.replicas)
    tf = _import_tf()
    data, train, test, test_split, generated = load_data(args)
    tf.keras.utils.set_random_seed(args.seed) if hasattr(tf, "keras") else None
    model = build_model(data, args, strategy, baseline=baseline)
    if args.preprocess_in_data and not baseline:
        train = preprocessed_dataset(train, model.sparse, args.batch_size, strategy)
        if args.replicas == 1:
            # With several replicas the held-out data stay global batches of ids: Keras's
            # evaluate on a distributed dataset (distribute_datasets_from_function) reports
            # metrics that differ from the same predictions' (seen with Keras 3.15, raw ids as
            # well), while the training on it is the same step for step.
            test = preprocessed_dataset(test, model.sparse, args.batch_size, strategy)
    throughput = _Throughput(args.batch_size)
    callbacks = [throughput]
    summaries = None
    if args.logdir:
        table_lr = None if baseline else table_optimizer(args.optimizer,
                                                         args.learning_rate).learning_rate
        summaries = _Summaries(args.logdir, args.log_every, table_lr)
        callbacks.append(summaries)
    if getattr(args, "delta_every", 0) > 0 and not baseline:
        from tf_sc_embedding.examples import live_deltas  # pylint: disable=import-outside-toplevel
        quantize = None if args.serving_quantize == "none" else args.serving_quantize
        callbacks.append(live_deltas.delta_exports(
            model, args.output_dir, args.delta_every,
            lambda path: export_serving_model(model, path, len(data.dense_names), quantize),
            dense_variables))
    epochs, steps_per_epoch, validation = 1, args.steps, None
    if args.eval_every:
        epochs, steps_per_epoch, validation = args.steps // args.eval_every, args.eval_every, test
    started = time.time()
    # The data are tf.data pipelines (already in the order they should be read): no Keras shuffle.
    model.fit(train, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=args.verbose,
              callbacks=callbacks, validation_data=validation, shuffle=False)
    trained = time.time() - started
    metrics = model.evaluate(test, verbose=0, return_dict=True)
    if summaries is not None:
        summaries.write_eval(metrics)
        summaries.close()
    if test_split is not None:
        n = (len(test_split) // args.batch_size) * args.batch_size
        labels = test_split.labels[:n]
        extra = {"oracle_auc": _oracle_auc(test_split, n), "data_seconds": generated}
    else:
        labels = data.eval_labels
        extra = {"data": list(data.files), "eval_data": data.eval_files,
                 "eval_samples": int(len(labels)), "data_seconds": generated}
    results = {
        "auc": float(metrics["auc"]), "log_loss": float(metrics["log_loss"]),
        "positive_rate": float(np.mean(labels)) if len(labels) else float("nan"),
        "train_seconds": trained, **extra,
        "samples_per_second": throughput.samples_per_second,
        "steps": args.steps, "batch_size": args.batch_size, "replicas": args.replicas,
        "embedding_dim": args.embedding_dim, "optimizer": args.optimizer,
        "frozen_tables": bool(args.freeze_tables), "baseline": baseline,
        "preprocess_in_data": bool(args.preprocess_in_data and not baseline),
        "pipelining": bool(args.pipelining),
        "raw_keys": bool(getattr(args, "raw_keys", False)),
    }
    if results["raw_keys"] and not baseline:
        embedding = model.sparse.embedding
        results.update(
            admission_threshold=args.admission_threshold,
            keys_held=int(sum(len(embedding.export_dynamic_table(name)[0])
                              for name in embedding.dynamic_tables.names)),
            unadmitted_ids=sum(embedding.counters().unadmitted_ids.values()),
            refused_keys=sum(embedding.counters().refused_keys.values()))
    if export and not baseline:
        os.makedirs(args.output_dir, exist_ok=True)
        checkpoint = tf.train.Checkpoint(model=model)
        results["checkpoint"] = checkpoint.save(os.path.join(args.output_dir, "checkpoint",
                                                             "dlrm"))
        export_dir = os.path.join(args.output_dir, "serving")
        export_serving_model(model, export_dir, len(data.dense_names),
                             None if args.serving_quantize == "none" else args.serving_quantize)
        results["export"] = export_dir
    return results, model, (data, test_split)


def _oracle_auc(split, n):
    from tf_sc_embedding.data.teacher import auc  # pylint: disable=import-outside-toplevel
    return auc(split.labels[:n], split.logits[:n])


def main(argv=None):
    args = parse_args(argv)
    strategy = make_strategy(args.replicas)
    source = (f"Criteo files ({len(args.data_files)} file(s))" if args.data
              else "teacher-labelled Criteo-like data")
    print(f"DLRM on {source}: {args.steps} steps x batch "
          f"{args.batch_size}, dim {args.embedding_dim}, tables: {args.optimizer}"
          f"{' (frozen)' if args.freeze_tables else ''}, MLPs: {args.dense_optimizer}, "
          f"{args.replicas} replica(s)", flush=True)
    results, _, _ = train_and_evaluate(args, strategy, export=not args.no_export)
    if "oracle_auc" in results:
        detail = (f"teacher's own AUC {results['oracle_auc']:.4f}, positive rate "
                  f"{results['positive_rate']:.3f}")
    else:
        detail = (f"{results['eval_samples']} held-out samples, positive rate "
                  f"{results['positive_rate']:.3f}")
    print(f"held-out AUC {results['auc']:.4f}  log loss {results['log_loss']:.4f}  ({detail})")
    print(f"training: {results['train_seconds']:.1f} s, "
          f"{results['samples_per_second']:.0f} samples/s")
    if "checkpoint" in results:
        print(f"checkpoint: {results['checkpoint']}")
        print(f"serving export: {results['export']}")
    if args.logdir:
        print(f"TensorBoard logs: {args.logdir}  (view: tensorboard --logdir {args.logdir})")
    os.makedirs(args.output_dir, exist_ok=True)
    with open(os.path.join(args.output_dir, "metrics.json"), "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
