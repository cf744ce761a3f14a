"""TensorFlow's pattern: `enqueue(next(distributed_iterator), device=...)` outside `strategy.run`
(cross-replica context, per-replica inputs), `dequeue` and `apply_gradients` inside it; same
activations and tables as the in-replica path."""
import numpy as np
import pytest
import tensorflow as tf

from tests.devices import mirrored_strategy, require_replicas
import tf_sc_embedding as sce

E = tf.tpu.experimental.embedding
GLOBAL = 16
VOCAB = {"video": 40, "user": 24}


def make(strategy):
    tables = {n: E.TableConfig(vocabulary_size=v, dim=4, combiner="mean", name=n,
                               initializer=tf.keras.initializers.RandomUniform(-1, 1, seed=v))
              for n, v in VOCAB.items()}
    features = {"watched": E.FeatureConfig(table=tables["video"], name="watched"),
                "user": E.FeatureConfig(table=tables["user"], name="user")}
    with strategy.scope():
        return sce.TPUEmbeddingV2(features, optimizer=E.Adagrad(learning_rate=0.1))


def dataset(seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 4, size=GLOBAL)
    watched = tf.RaggedTensor.from_row_lengths(
        rng.integers(0, VOCAB["video"], size=int(lengths.sum())), lengths)
    user = tf.constant(rng.integers(0, VOCAB["user"], size=GLOBAL))
    weights = tf.RaggedTensor.from_row_lengths(
        rng.uniform(0.5, 2, size=int(lengths.sum())).astype(np.float32), lengths)
    ds = tf.data.Dataset.from_tensor_slices(({"watched": watched, "user": user},
                                             {"watched": weights, "user": tf.ones([GLOBAL])}))
    return ds.batch(GLOBAL // 2, drop_remainder=True).repeat(2)


def grads_of(activations):
    return tf.nest.map_structure(lambda a: tf.cos(a) + 0.5, activations)


def run(mode, device=None, eager=False):
    strategy = mirrored_strategy(2)
    embedding = make(strategy)
    iterator = iter(strategy.experimental_distribute_dataset(
        dataset()))

    def in_replica(ids, weights):
        activations, preserved = embedding(ids, weights)
        embedding.apply_gradients(grads_of(activations), preserved)
        return activations

    def dequeue_step(preprocessed):
        activations, preserved = embedding.dequeue(preprocessed)
        embedding.apply_gradients(grads_of(activations), preserved)
        return activations

    def step():
        ids, weights = next(iterator)
        if mode == "in_replica":
            return strategy.run(in_replica, args=(ids, weights))
        preprocessed = embedding.enqueue(ids, weights, device=device)
        return strategy.run(dequeue_step, args=(preprocessed,))

    step_fn = step if eager else tf.function(step)
    outs = []
    for _ in range(3):
        out = step_fn()
        outs.append({k: np.concatenate([t.numpy() for t in strategy.experimental_local_results(v)])
                     for k, v in out.items()})
    return outs, embedding.logical_tables(include_slots=True)


@pytest.mark.parametrize("device,eager", [(None, False), ("/cpu:0", False), (None, True)])
def test_cross_replica_enqueue_matches_in_replica_path(device, eager):
    require_replicas(2)
    want_outs, want_tables = run("in_replica")
    got_outs, got_tables = run("cross_replica", device=device, eager=eager)
    for want, got in zip(want_outs, got_outs):
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6, err_msg=k)
    for name in want_tables:
        for kind in want_tables[name]:
            np.testing.assert_allclose(got_tables[name][kind], want_tables[name][kind],
                                       rtol=1e-6, atol=1e-6, err_msg=f"{name}/{kind}")


def test_preprocessing_runs_on_the_requested_or_replica_device():
    strategy = mirrored_strategy(2)
    embedding = make(strategy)
    ids, weights = next(iter(strategy.experimental_distribute_dataset(dataset())))
    by_replica = embedding.enqueue(ids, weights)
    devices = [tf.nest.flatten(v)[0].device
               for v in strategy.experimental_local_results(by_replica)]
    assert devices[0].endswith("CPU:0") and devices[1].endswith("CPU:1")
    on_one = embedding.enqueue(ids, weights, device="/cpu:1")
    assert all(tf.nest.flatten(v)[0].device.endswith("CPU:1")
               for v in strategy.experimental_local_results(on_one))


def test_per_replica_inputs_inside_strategy_run_are_rejected():
    strategy = mirrored_strategy(2)
    embedding = make(strategy)
    ids, weights = next(iter(strategy.experimental_distribute_dataset(dataset())))
    embedding.enqueue(ids, weights)   # builds

    @tf.function
    def bad():
        def fn():
            return embedding.enqueue(ids, weights)
        return strategy.run(fn)
    with pytest.raises(ValueError, match="cross-replica context"):
        bad()
