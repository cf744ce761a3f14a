"""Shared machinery of the parity tests (`test_*_parity.py` and friends): the training harness
around `tf_sc_embedding.TPUEmbeddingV2` and its two independent references.

Every run trains a few steps with a custom loop (`strategy.run` around the lookup, a simple loss,
`apply_gradients`, all inside one `tf.function`) and compares, after every step, the logical
tables, every slot and the activations with

(a) the pure-numpy reference of `reference_training.py` (docs/preprocessing.md#combiners / docs/optimizers.md#fused-backward-pass on logical tables), and
(b) a dense TensorFlow reference: logical `tf.Variable`s, `tf.nn.embedding_lookup_sparse`,
    `tf.GradientTape`, and the same update formulas written with TF ops applied to the summed
    `IndexedSlices` gradient (SGD and Adagrad are also checked against `tf.compat.v1.train`).

The feature config has four features on three tables: `a1` and `a2` share table `big` (duplicates
across features), `small` stacks with `big` (same padded width) and `wide` lives in its own stacked
table. Ids are drawn from a few "hot" rows (duplicates across samples and replicas, including
adjacent and non-adjacent duplicates inside a sample) plus the last row; most rows stay
untouched and must not change at all.
"""
import dataclasses
from typing import Dict

import numpy as np
import tensorflow as tf

import tf_sc_embedding as sce
from tests import devices
from tests.api import reference_training as rt

E = tf.tpu.experimental.embedding

RTOL = 1e-5
ATOL = 1e-6
PER_REPLICA_BATCH = 8
STEPS = 3
MAX_IDS_PER_SAMPLE = 4
LOSS_SCALE = 0.5


def loss_of(activations, targets):
    """sum(stop_gradient(LOSS_SCALE * a + target) * a), so dA = LOSS_SCALE * a + target.

    The gradient has a single contribution and LOSS_SCALE is a power of two: dA is then the
    same bits however TensorFlow orders or fuses the gradient ops in different graphs.
    """
    return tf.add_n([tf.reduce_sum(tf.stop_gradient(LOSS_SCALE * a + targets[k]) * a)
                     for k, a in activations.items()])


@dataclasses.dataclass(frozen=True)
class TableSpec:
    name: str
    vocab: int
    dim: int
    hot: int  # ids are drawn from [0, hot) plus vocab - 1


TABLES = (TableSpec("big", 40, 6, 9), TableSpec("small", 19, 8, 5), TableSpec("wide", 11, 12, 4))
FEATURES = (("a1", "big"), ("a2", "big"), ("b", "small"), ("c", "wide"))

# name -> (TF optimizer class, default hyperparameters of the parity runs). AdagradMomentum's and
# Adam's epsilons are not tiny: with epsilon -> 0 they normalise g / |g|, which turns the float32
# reordering error of a nearly cancelling summed gradient into an O(1) relative error.
OPTIMIZERS = {
    "sgd": (E.SGD, dict(learning_rate=0.1)),
    "adagrad": (E.Adagrad, dict(learning_rate=0.1, initial_accumulator_value=0.2)),
    "row_wise_adagrad": (sce.RowWiseAdagrad, dict(learning_rate=0.1, initial_accumulator_value=0.2,
                                                  epsilon=1e-3)),
    "adagrad_momentum": (E.AdagradMomentum, dict(learning_rate=0.05, momentum=0.9,
                                                 use_nesterov=True, exponent=3.0, beta2=0.95,
                                                 epsilon=0.02)),
    "adam": (E.Adam, dict(learning_rate=0.05, beta_1=0.8, beta_2=0.9, epsilon=0.02)),
    "ftrl": (E.FTRL, dict(learning_rate=0.2, l1_regularization_strength=0.01,
                          l2_regularization_strength=0.05, beta=0.1,
                          initial_accumulator_value=0.1)),
}


def make_optimizer(name, **overrides):
    cls, defaults = OPTIMIZERS[name]
    return cls(**{**defaults, **overrides})


COMBINERS = ("sum", "mean", "sqrtn")
KINDS = ("dense", "ragged", "sparse")
REPLICAS = ("none", 1, 2, 4)  # "none": no strategy (the default strategy), one replica


def assert_close(actual, expected, what, rtol=RTOL, atol=ATOL):
    """float32 closeness; the absolute tolerance scales with the array's largest magnitude.

    Values that come out of cancelling sums (FTRL's linears, momenta) carry absolute errors of
    the order of the cancelled terms, not of the result; the references and the library sum
    duplicates in different orders.
    """
    expected = np.asarray(expected)
    scale = max(1.0, float(np.abs(expected).max())) if expected.size else 1.0
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=rtol, atol=atol * scale,
                               err_msg=what)


skip_without_devices = devices.require_replicas


def make_strategy(replicas):
    if replicas == "none":
        return tf.distribute.get_strategy()
    return devices.mirrored_strategy(replicas)


def num_replicas(replicas):
    return 1 if replicas == "none" else replicas


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------

def initial_table(spec, seed=0):
    rng = np.random.default_rng([seed, spec.vocab, spec.dim])
    return rng.uniform(-0.5, 0.5, (spec.vocab, spec.dim)).astype(np.float32)


def random_feature(rng, spec, combiner, kind, weighted, global_batch):
    """A reference Feature over the global batch with many duplicates."""
    pool = list(range(spec.hot)) + [spec.vocab - 1]
    ids, weights = [], []
    for _ in range(global_batch):
        n = 1 if kind == "dense" else int(rng.integers(0, MAX_IDS_PER_SAMPLE + 1))
        sample = [int(x) for x in rng.choice(pool, size=n)]
        if n >= 2 and rng.random() < 0.3:
            sample[1] = sample[0]  # adjacent duplicate (merged by the host preprocessing)
        ids.append(sample)
        weights.append([float(np.float32(w)) for w in rng.uniform(0.5, 2.0, size=n)])
    return rt.Feature(spec.name, combiner, ids, weights if weighted else None)


def feature_tensors(feature, kind, start, stop, dtype=tf.int64, weighted=None):
    """(ids, weights or None) of samples [start, stop) as the user passes them."""
    weighted = feature.weights is not None if weighted is None else weighted
    ids = feature.ids[start:stop]
    weights = feature.weights[start:stop] if weighted else None
    if kind == "dense":
        t = tf.constant([s[0] for s in ids], dtype)
        w = tf.constant([s[0] for s in weights], tf.float32) if weighted else None
        return t, w
    lengths = [len(s) for s in ids]
    flat = [i for s in ids for i in s]
    if kind == "ragged":
        t = tf.RaggedTensor.from_row_lengths(tf.constant(flat, dtype), lengths)
        w = (tf.RaggedTensor.from_row_lengths(
            tf.constant([x for s in weights for x in s], tf.float32), lengths)
            if weighted else None)
        return t, w
    indices = [[b, j] for b, s in enumerate(ids) for j in range(len(s))]
    shape = [stop - start, MAX_IDS_PER_SAMPLE]
    t = tf.SparseTensor(tf.constant(indices, tf.int64, shape=[len(indices), 2]),
                        tf.constant(flat, dtype), shape)
    w = (tf.SparseTensor(tf.constant(indices, tf.int64, shape=[len(indices), 2]),
                         tf.constant([x for s in weights for x in s], tf.float32), shape)
         if weighted else None)
    return t, w


def random_steps(seed, combiner, kind, weighted, replicas, steps=STEPS, features=FEATURES):
    """Per step: ({key: Feature}, {key: target [global batch, dim]})."""
    rng = np.random.default_rng(seed)
    specs = {t.name: t for t in TABLES}
    gb = PER_REPLICA_BATCH * replicas
    out = []
    for _ in range(steps):
        feats = {k: random_feature(rng, specs[t], combiner, kind, weighted, gb)
                 for k, t in features}
        targets = {k: rng.uniform(-1, 1, (gb, specs[t].dim)).astype(np.float32)
                   for k, t in features}
        out.append((feats, targets))
    return out


# --------------------------------------------------------------------------------------------
# The library under test
# --------------------------------------------------------------------------------------------

def placeholder_targets(feats):
    """Targets for a batch that is only looked up, not trained on (their values are not used)."""
    return {k: np.zeros((len(f.ids), 1), np.float32) for k, f in feats.items()}


def table_configs(combiner, optimizer=None, seed=0, optimizers=None):
    """{name: TableConfig}; `optimizers` overrides the per-table optimizer by table name."""
    return {t.name: E.TableConfig(vocabulary_size=t.vocab, dim=t.dim,
                                  initializer=tf.constant_initializer(initial_table(t, seed)),
                                  optimizer=(optimizers or {}).get(t.name, optimizer),
                                  combiner=combiner, name=t.name)
            for t in TABLES}


def flat_template(features=FEATURES):
    """The default feature structure: {key: key}."""
    return {k: k for k, _ in features}


class Trainer:
    """TPUEmbeddingV2 + a custom training loop over `strategy.run` in one tf.function.

    `template` is the user's feature structure with feature keys as leaves (default {key: key});
    the feature config, inputs, weights and activations all have that structure.
    """

    def __init__(self, replicas, optimizer, combiner, kind, sc_config=None, dtype=tf.int64,
                 use_function=True, features=FEATURES, template=None, table_optimizers=None,
                 none_gradients=(), build=True, tables=None, replicated=(),
                 **embedding_kwargs):
        self.replicas = replicas
        self.n = num_replicas(replicas)
        self.kind = kind
        self.dtype = dtype
        self.features = features
        self.template = flat_template(features) if template is None else template
        self.keys = tf.nest.flatten(self.template)
        self.strategy = make_strategy(replicas)
        self.tables = (table_configs(combiner, optimizer, optimizers=table_optimizers)
                       if tables is None else tables)
        by_key = {k: E.FeatureConfig(table=self.tables[t], name=k) for k, t in features}
        self.config = tf.nest.map_structure(lambda k: by_key[k], self.template)
        self.none_gradients = set(none_gradients)
        self.optimizer = optimizer
        with self.strategy.scope():
            # Every table sharded unless the test asks for replicated ones (`replicated`).
            self.embedding = sce.TPUEmbeddingV2(
                self.config, optimizer, sparse_core_embedding_config=sc_config,
                replication_threshold_bytes=0,
                table_placement={t: "replicated" for t in replicated}, **embedding_kwargs)
            if build:
                # Explicit build: building lazily from the first lookup is broken (see
                # test_lazy_build_from_first_lookup).
                self.embedding.build(per_replica_batch_size=PER_REPLICA_BATCH)
        self.step_fn = tf.function(self._step) if use_function else self._step

    def _structured(self, by_key):
        return tf.nest.map_structure(lambda k: by_key[k], self.template)

    def _replica_step(self, features, weights, targets, next_features=None, next_weights=None):
        # next_features: the next step's batch, prefetched (docs/pipelining.md); None: no prefetch.
        activations, preserved = self.embedding.embedding_lookup(features, weights,
                                                                 next_features, next_weights)
        flat = dict(zip(self.keys, tf.nest.flatten(activations)))
        with tf.GradientTape() as tape:
            tape.watch(flat)
            loss = loss_of(flat, targets)
        gradients = tape.gradient(loss, flat)
        gradients = {k: None if k in self.none_gradients else g for k, g in gradients.items()}
        self.embedding.apply_gradients(self._structured(gradients), preserved)
        return flat

    def _step(self, *inputs):
        if self.replicas == "none":
            return self._replica_step(*inputs)
        return self.strategy.run(self._replica_step, args=inputs)

    def replica_inputs(self, feats, targets, r):
        """(features, weights or None, {key: targets}) of replica r's slice of the batch."""
        start, stop = r * PER_REPLICA_BATCH, (r + 1) * PER_REPLICA_BATCH
        ids, weights = {}, {}
        for k, f in feats.items():
            ids[k], weights[k] = feature_tensors(f, self.kind, start, stop, self.dtype)
        weights = (None if all(w is None for w in weights.values())
                   else self._structured(weights))
        return (self._structured(ids), weights,
                {k: tf.constant(v[start:stop]) for k, v in targets.items()})

    def distributed(self, per_replica_values):
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: per_replica_values[ctx.replica_id_in_sync_group])

    def global_values(self, per_replica):
        """{key: numpy [global batch, dim]} of per-replica outputs."""
        if self.replicas == "none":
            return {k: v.numpy() for k, v in per_replica.items()}
        return {k: np.concatenate([x.numpy() for x in
                                   self.strategy.experimental_local_results(v)])
                for k, v in per_replica.items()}

    def inputs(self, feats, targets):
        """[features, weights or None, targets] of the global batch as the step function takes
        them (per-replica values with several replicas)."""
        if self.replicas == "none":
            return list(self.replica_inputs(feats, targets, 0))
        per_replica = [self.replica_inputs(feats, targets, r) for r in range(self.n)]
        inputs = [self.distributed([x[i] for x in per_replica]) for i in range(3)]
        if per_replica[0][1] is None:
            inputs[1] = None
        return inputs

    def step(self, feats, targets, next_feats=None):
        """Runs one step on the global batch (prefetching next_feats' lookup if given); returns
        {key: global activations (numpy)}."""
        inputs = self.inputs(feats, targets)
        if next_feats is not None:
            inputs += self.inputs(next_feats, placeholder_targets(next_feats))[:2]
        return self.global_values(self.step_fn(*inputs))

    def logical_tables(self):
        return {c.name: t for c, t in self.embedding.embedding_tables.items()}

    def logical_slots(self, slot_names=None):
        out = {}
        for name, c in self.tables.items():
            names = (slot_names if slot_names is not None else
                     rt.optimizer_definition(c.optimizer or self.optimizer).slot_names)
            out[name] = {s: self.embedding.logical_slot(c, s) for s in names}
        return out


# --------------------------------------------------------------------------------------------
# Dense TensorFlow reference
# --------------------------------------------------------------------------------------------

def tf_optimizer_step(definition, g, w, slots, lr):
    """The docs/optimizers.md#per-row-formulas per-row formulas with TF ops, on gathered rows [n, dim]."""
    hp = definition.hyperparameters
    name = definition.name
    if name == "sgd":
        new_w, new_slots = w - lr * g, []
    elif name == "adagrad":
        (a,) = slots
        a = a + g * g
        new_w, new_slots = w - lr * g / tf.sqrt(a), [a]
    elif name == "row_wise_adagrad":
        (a,) = slots
        a = a + tf.reduce_mean(g * g, axis=1, keepdims=True)
        new_w, new_slots = w - lr / (tf.sqrt(a) + hp["epsilon"]) * g, [a]
    elif name == "adagrad_momentum":
        a, m = slots
        beta1, beta2 = tf.constant(hp["beta1"], tf.float32), tf.constant(hp["beta2"], tf.float32)
        a = a + g * g if hp["beta2"] == 1 else beta2 * a + (1 - beta2) * g * g
        g_hat = tf.pow(a + hp["epsilon"], -(1.0 / tf.constant(hp["exponent"], tf.float32))) * g
        m = beta1 * m + g_hat
        new_w = w - lr * (beta1 * m + g_hat) if hp["use_nesterov"] else w - lr * m
        new_slots = [a, m]
    elif name == "adam":
        m, v = slots
        beta1, beta2 = tf.constant(hp["beta1"], tf.float32), tf.constant(hp["beta2"], tf.float32)
        eps = tf.constant(hp["epsilon"], tf.float32)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        denominator = (tf.sqrt(v + eps * eps) if hp["use_sum_inside_sqrt"]
                       else tf.sqrt(v) + eps)
        new_w, new_slots = w - lr * m / denominator, [m, v]
    elif name == "ftrl":
        a, lin = slots
        p = -tf.constant(hp["learning_rate_power"], tf.float32)
        l1 = tf.constant(hp["l1_regularization_strength"], tf.float32)
        l2 = tf.constant(hp["l2_regularization_strength"], tf.float32)
        beta = tf.constant(hp["beta"], tf.float32)
        a_new = a + g * g
        p_old, p_new = tf.pow(a, p), tf.pow(a_new, p)
        if hp["multiply_linear_by_learning_rate"]:
            lin = lin + lr * g - (p_new - p_old) * w
            numerator = tf.clip_by_value(lin, -lr * l1, lr * l1) - lin
            new_w = numerator / (p_new + 2 * lr * l2 + beta)
        else:
            lin = lin + g - (p_new - p_old) * w / lr
            numerator = tf.clip_by_value(lin, -l1, l1) - lin
            new_w = numerator / ((p_new + beta) / lr + 2 * l2)
        new_slots = [a_new, lin]
    else:
        raise ValueError(name)
    new_w = tf.clip_by_value(new_w, max(definition.clip_min, -3e38),
                             min(definition.clip_max, 3e38))
    return new_w, new_slots


class DenseTFReference:
    """Logical tf.Variables trained with embedding_lookup_sparse and IndexedSlices gradients."""

    def __init__(self, tables: Dict[str, np.ndarray], optimizers, with_v1=False):
        self.optimizers = optimizers
        self.tables = {k: tf.Variable(v) for k, v in tables.items()}
        self.slots = {k: {s: tf.Variable(v) for s, v in
                          rt.initial_slots(optimizers[k], tables[k].shape).items()}
                      for k in tables}
        self.v1 = None
        if with_v1:
            self.v1 = {k: tf.Variable(v) for k, v in tables.items()}
            self.v1_optimizers = {k: self._v1_optimizer(o) for k, o in optimizers.items()}

    @staticmethod
    def _v1_optimizer(config):
        kind = type(config).__name__
        lr = rt.current_learning_rate(config)
        if kind == "SGD":
            return tf.compat.v1.train.GradientDescentOptimizer(lr)
        if kind == "Adagrad":
            return tf.compat.v1.train.AdagradOptimizer(
                lr, initial_accumulator_value=config.initial_accumulator_value)
        raise ValueError(f"no tf.compat.v1 optimizer for {kind}")

    def _activations(self, tables, feats):
        out = {}
        for k, f in feats.items():
            indices = [[b, j] for b, s in enumerate(f.ids) for j in range(len(s))]
            shape = [len(f.ids), MAX_IDS_PER_SAMPLE]
            sp_ids = tf.SparseTensor(tf.constant(indices, tf.int64, [len(indices), 2]),
                                     tf.constant([i for s in f.ids for i in s], tf.int64), shape)
            sp_w = None
            if f.weights is not None:
                sp_w = tf.SparseTensor(sp_ids.indices, tf.constant(
                    [w for s in f.weights for w in s], tf.float32), shape)
            a = tf.nn.embedding_lookup_sparse(tables[f.table], sp_ids, sp_w,
                                              combiner=f.combiner)
            # Trailing samples without ids are missing from the result.
            out[k] = tf.pad(a, [[0, len(f.ids) - tf.shape(a)[0]], [0, 0]])
        return out

    @staticmethod
    def _loss(acts, targets, none_gradients):
        # A feature without gradient contributes 0 * (...): its ids are still in the
        # IndexedSlices, with zero values (the spec's "None means zeros").
        return loss_of({k: a * (0.0 if k in none_gradients else 1.0)
                        for k, a in acts.items()}, targets)

    def step(self, feats, targets, learning_rates=None, none_gradients=()):
        names = sorted(self.tables)
        with tf.GradientTape() as tape:
            acts = self._activations(self.tables, feats)
            loss = self._loss(acts, targets, none_gradients)
        grads = dict(zip(names, tape.gradient(loss, [self.tables[n] for n in names])))
        if self.v1 is not None:
            with tf.GradientTape() as tape:
                v1_loss = self._loss(self._activations(self.v1, feats), targets, none_gradients)
            v1_grads = dict(zip(names, tape.gradient(v1_loss, [self.v1[n] for n in names])))
        for name in names:
            config = self.optimizers[name]
            lr = (learning_rates or {}).get(name)
            lr = tf.constant(rt.current_learning_rate(config) if lr is None else lr, tf.float32)
            grad = grads[name]
            if grad is None:
                continue
            assert isinstance(grad, tf.IndexedSlices), type(grad)
            rows, position = tf.unique(grad.indices)
            summed = tf.math.unsorted_segment_sum(grad.values, position, tf.size(rows))
            definition = rt.optimizer_definition(config)
            slot_vars = [self.slots[name][s] for s in definition.slot_names]
            new_w, new_slots = tf_optimizer_step(
                definition, summed, tf.gather(self.tables[name], rows),
                [tf.gather(s, rows) for s in slot_vars], lr)
            self.tables[name].scatter_update(tf.IndexedSlices(new_w, rows))
            for var, value in zip(slot_vars, new_slots):
                var.scatter_update(tf.IndexedSlices(value, rows))
            if self.v1 is not None and v1_grads[name] is not None:
                self.v1_optimizers[name].apply_gradients([(v1_grads[name], self.v1[name])])
        return {k: v.numpy() for k, v in acts.items()}


# --------------------------------------------------------------------------------------------
# The parity check
# --------------------------------------------------------------------------------------------

class ReferenceRun:
    """The numpy reference and the dense TF reference, stepped together."""

    def __init__(self, optimizers, with_v1=False):
        self.optimizers = optimizers
        self.tables = {t.name: initial_table(t) for t in TABLES}
        self.slots = {t.name: rt.initial_slots(optimizers[t.name], (t.vocab, t.dim))
                      for t in TABLES}
        self.dense = DenseTFReference(self.tables, optimizers, with_v1=with_v1)
        self.touched = {t.name: set() for t in TABLES}

    def step(self, feats, targets, learning_rates=None, none_gradients=()):
        """Returns the expected activations (numpy) and checks the dense TF reference."""
        acts = rt.forward(self.tables, feats)
        grads = {k: None if k in none_gradients else LOSS_SCALE * a + targets[k]
                 for k, a in acts.items()}
        self.tables, self.slots = rt.apply_gradients(self.tables, self.slots, self.optimizers,
                                                     feats, grads, learning_rates)
        for name, rows in rt.touched_rows(feats).items():
            self.touched[name].update(rows)
        dense_acts = self.dense.step(feats, targets, learning_rates, none_gradients)
        for k in acts:
            assert_close(dense_acts[k], acts[k], f"dense TF activations of '{k}' vs numpy")
        for name in self.tables:
            assert_close(self.dense.tables[name].numpy(), self.tables[name],
                         f"dense TF table '{name}' vs numpy")
            if self.dense.v1 is not None:
                assert_close(self.dense.v1[name].numpy(), self.tables[name],
                             f"tf.compat.v1 table '{name}' vs numpy")
            for s, value in self.slots[name].items():
                assert_close(self.dense.slots[name][s].numpy(), value,
                             f"dense TF slot '{s}' of '{name}' vs numpy")
        return acts

    def check(self, trainer, acts, expected_acts, where):
        for k in expected_acts:
            assert_close(acts[k], expected_acts[k], f"{where}: activations of '{k}'")
        tables, slots = trainer.logical_tables(), trainer.logical_slots()
        for name in self.tables:
            assert_close(tables[name], self.tables[name], f"{where}: table '{name}'")
            assert set(slots[name]) == set(self.slots[name])
            for s in self.slots[name]:
                assert_close(slots[name][s], self.slots[name][s],
                             f"{where}: slot '{s}' of '{name}'")

    def check_untouched(self, trainer):
        """Untouched rows and their slots are bit-for-bit their initial values."""
        tables, slots = trainer.logical_tables(), trainer.logical_slots()
        for t in TABLES:
            untouched = sorted(set(range(t.vocab)) - self.touched[t.name])
            assert untouched, "the data should leave some rows untouched"
            np.testing.assert_array_equal(tables[t.name][untouched],
                                          initial_table(t)[untouched])
            initial = rt.initial_slots(self.optimizers[t.name], (t.vocab, t.dim))
            for s, value in initial.items():
                np.testing.assert_array_equal(slots[t.name][s][untouched], value[untouched])


def run_parity(optimizer_name, combiner, kind, weighted, replicas, seed=0, optimizer_kwargs=None,
               with_v1=None, learning_rates=None, table_optimizers=None, data_filter=None,
               **trainer_kwargs):
    """Trains STEPS steps; checks the library against both references after every step.

    `learning_rates[step]` (optional) is assigned to a tf.Variable read by a callable learning
    rate before each step. Returns (trainer, reference, per-step activations).
    """
    lr_variable = None
    optimizer_kwargs = dict(optimizer_kwargs or {})
    if learning_rates is not None:
        lr_variable = tf.Variable(learning_rates[0], dtype=tf.float32)
        optimizer_kwargs["learning_rate"] = lambda: lr_variable
    optimizer = (make_optimizer(optimizer_name, **optimizer_kwargs)
                 if optimizer_name is not None else None)
    n = num_replicas(replicas)
    trainer = Trainer(replicas, optimizer, combiner, kind, table_optimizers=table_optimizers,
                      **trainer_kwargs)
    optimizers = {t.name: (table_optimizers or {}).get(t.name, optimizer) for t in TABLES}
    if with_v1 is None:
        with_v1 = (optimizer_name in ("sgd", "adagrad") and not optimizer_kwargs
                   and not table_optimizers)
    reference = ReferenceRun(optimizers, with_v1=with_v1)
    none_gradients = trainer_kwargs.get("none_gradients", ())
    history = []
    steps = random_steps(seed, combiner, kind, weighted, n)
    if data_filter is not None:
        steps = data_filter(steps)
    for step, (feats, targets) in enumerate(steps):
        lrs = None
        if lr_variable is not None:
            lr_variable.assign(learning_rates[step])
            lrs = {t.name: learning_rates[step] for t in TABLES}
        expected = reference.step(feats, targets, lrs, none_gradients)
        acts = trainer.step(feats, targets)
        reference.check(trainer, acts, expected, f"step {step}")
        history.append(acts)
    reference.check_untouched(trainer)
    return trainer, reference, history
