"""Prefetching the next lookup with open vocabularies (docs/dynamic_vocabulary.md#pipelining):
the prefetch only sends the keys to their owners, the consuming step maps them, so a prefetching
loop trains bit for bit like the pipelined loop without prefetching, and a prefetch that is never
consumed (the last batch, a plain lookup, a restore, a failed step) leaves no count behind."""
import numpy as np
import pytest
import tensorflow as tf

import tf_sc_embedding as sce
from tests.api import parity_helpers as ph
from tests.api.test_dynamic_vocabulary import ids_tensor, key_values

E = tf.tpu.experimental.embedding
DIM = 4
BATCH = 16
# dA = LOSS_SCALE * a + OFFSETS[feature]: exact in float32.
OFFSETS = {"f1": np.float32(0.25), "f2": np.float32(-0.125), "f3": np.float32(0.5)}
MAP_STATE = ("keys", "last_seen", "pending_keys", "pending_counts", "pending_last_seen",
             "last_step", "values", "slot_accumulators")
KEYS_STATE = MAP_STATE[:6]   # what mapping keys changes


def make_embedding(strategy, key_dtype, capacity=12, fixed_table=True):
    """Features f1, f2 on open vocabulary 'items' (threshold 2, rows given back after 1 unseen
    step, fewer rows than keys: admission, eviction, refusals and, over several replicas,
    lending all happen), f3 on the fixed table 'ids'; pipelined."""
    items = E.TableConfig(vocabulary_size=capacity, dim=DIM, name="items", combiner="mean",
                          initializer=tf.initializers.TruncatedNormal(stddev=0.1))
    ids = E.TableConfig(vocabulary_size=16, dim=DIM, name="ids", combiner="sum",
                        initializer=tf.constant_initializer(0.25))
    features = {"f1": E.FeatureConfig(table=items, name="f1"),
                "f2": E.FeatureConfig(table=items, name="f2")}
    if fixed_table:
        features["f3"] = E.FeatureConfig(table=ids, name="f3")
    with strategy.scope():
        return sce.TPUEmbeddingV2(
            features, optimizer=ph.make_optimizer("adagrad"),
            dynamic_vocabularies={"items": sce.DynamicVocabulary(
                key_dtype=key_dtype, admission_threshold=2, steps_to_live=1)},
            pipeline_execution_with_tensor_core=True)


def random_batches(rng, steps, keys):
    return [{"f1": [list(rng.choice(keys, int(rng.integers(1, 4)))) for _ in range(BATCH)],
             "f2": [list(rng.choice(keys, int(rng.integers(1, 3)))) for _ in range(BATCH)],
             "f3": [list(rng.integers(0, 16, int(rng.integers(1, 3)))) for _ in range(BATCH)]}
            for _ in range(steps)]


class Loop:
    """Steps of one embedding on a strategy: plain (embedding(features)) or prefetching
    (next_features), each returning the global activations (numpy)."""

    def __init__(self, embedding, strategy, key_dtype):
        self.embedding, self.strategy, self.key_dtype = embedding, strategy, key_dtype
        self.replicas = strategy.num_replicas_in_sync

        def replica_step(features, upcoming=None):
            if upcoming is None:
                activations, preserved = embedding(features)
            else:
                activations, preserved = embedding(features, next_features=upcoming)
            gradients = {k: ph.LOSS_SCALE * a + OFFSETS[k] for k, a in activations.items()}
            with tf.control_dependencies(embedding.apply_gradients(gradients, preserved)):
                return {k: tf.identity(a) for k, a in activations.items()}

        def replica_inference(features, upcoming=None):
            activations, _ = embedding(features, next_features=upcoming, training=False)
            return activations

        self._plain = tf.function(lambda f: strategy.run(replica_step, args=(f,)))
        self._inference = tf.function(lambda f: strategy.run(replica_inference, args=(f,)))
        self._inference_prefetching = tf.function(
            lambda f, u: strategy.run(replica_inference, args=(f, u)))
        self._prefetching = tf.function(lambda f, u: strategy.run(replica_step, args=(f, u)))
        self._prefetch = tf.function(lambda f: strategy.run(embedding.prefetch, args=(f,)))

    def features(self, batch):
        size = BATCH // self.replicas
        per_replica = [{k: ids_tensor(s[r * size:(r + 1) * size], "ragged",
                                      self.key_dtype if k != "f3" else tf.int64)
                        for k, s in batch.items()} for r in range(self.replicas)]
        return self.strategy.experimental_distribute_values_from_function(
            lambda context: per_replica[context.replica_id_in_sync_group])

    def _gathered(self, outputs):
        return {k: np.concatenate([x.numpy() for x in self.strategy.experimental_local_results(v)])
                for k, v in outputs.items()}

    def prefetch(self, batch):
        self._prefetch(self.features(batch))

    def step(self, batch, upcoming=None):
        if upcoming is None:
            return self._gathered(self._plain(self.features(batch)))
        return self._gathered(self._prefetching(self.features(batch), self.features(upcoming)))

    def infer(self, batch, upcoming=None):
        """A lookup with training=False (no gradients, no map change)."""
        if upcoming is None:
            return self._gathered(self._inference(self.features(batch)))
        return self._gathered(self._inference_prefetching(self.features(batch),
                                                          self.features(upcoming)))

    def run(self, batches, prefetch):
        """Every batch once; with prefetch, every step but the last prefetches the next."""
        if prefetch:
            self.prefetch(batches[0])
        return [self.step(b, batches[n + 1] if prefetch and n + 1 < len(batches) else None)
                for n, b in enumerate(batches)]


def assert_same_state(got, want, where, counters=True):
    """Every part of the open vocabulary's map state, its counters (which a checkpoint does not
    hold) and the fixed table, exactly."""
    mine, theirs = (e.dynamic_tables.logical_state("items") for e in (got, want))
    for part in MAP_STATE:
        np.testing.assert_array_equal(mine[part], theirs[part], err_msg=f"{where}: {part}")
    for a, b in zip(got.export_dynamic_table("items"), want.export_dynamic_table("items")):
        np.testing.assert_array_equal(a, b, err_msg=f"{where}: export")
    if counters:
        assert got.counters().unadmitted_ids == want.counters().unadmitted_ids, where
        assert got.counters().refused_keys == want.counters().refused_keys, where
    np.testing.assert_array_equal(got.embedding_tables[got.tables.config("ids")],
                                  want.embedding_tables[want.tables.config("ids")],
                                  err_msg=f"{where}: fixed table")


def assert_same_activations(got, want):
    for step, (a, b) in enumerate(zip(got, want)):
        for name in b:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"step {step} {name}")


@pytest.mark.parametrize("replicas,key_dtype", [(1, tf.int64),
                                                pytest.param(2, tf.string, marks=pytest.mark.slow),
                                                pytest.param(4, tf.int64, marks=pytest.mark.slow)])
def test_prefetching_trains_like_pipelining_without_it(replicas, key_dtype):
    """The same activations, rows, slots, counts and counters, bit for bit. The last batch is
    prefetched and then trained by a plain step, which counts it once."""
    rng = np.random.default_rng(replicas)
    batches = random_batches(rng, 6, key_values(rng, 24, key_dtype))
    strategy = ph.make_strategy(replicas)
    prefetching = make_embedding(strategy, key_dtype)
    got = Loop(prefetching, strategy, key_dtype).run(batches, prefetch=True)
    pipelined = make_embedding(strategy, key_dtype)
    want = Loop(pipelined, strategy, key_dtype).run(batches, prefetch=False)
    assert_same_activations(got, want)
    assert_same_state(prefetching, pipelined, "after the last step")
    counters = prefetching.counters()
    assert sum(counters.refused_keys.values()) > 0 and sum(counters.unadmitted_ids.values()) > 0


@pytest.mark.parametrize("replicas", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_prefetch_never_consumed_leaves_no_count(replicas):
    """A prefetched batch that a plain lookup of another batch replaces, and one a failed step
    (given the wrong batch) leaves behind, change no map: the run equals one that never
    prefetched them."""
    rng = np.random.default_rng(10 + replicas)
    keys = key_values(rng, 16, tf.int64)
    batches = random_batches(rng, 5, keys)
    unused = random_batches(rng, 1, key_values(rng, 6, tf.int64))[0]   # keys seen nowhere else
    strategy = ph.make_strategy(replicas)
    embedding = make_embedding(strategy, tf.int64)
    loop = Loop(embedding, strategy, tf.int64)
    loop.prefetch(batches[0])
    got = [loop.step(batches[0], unused)]              # prefetches `unused`
    with pytest.raises(tf.errors.InvalidArgumentError, match="not the batch prefetched"):
        loop.step(batches[1], batches[2])              # batch 1 is not what was prefetched
    got.append(loop.step(batches[1]))                  # a plain lookup forgets `unused`
    loop.prefetch(batches[2])
    got += [loop.step(batches[2], batches[3]), loop.step(batches[3], batches[4]),
            loop.step(batches[4])]

    plain = make_embedding(strategy, tf.int64)
    want = Loop(plain, strategy, tf.int64).run(batches, prefetch=False)
    assert_same_activations(got, want)
    assert_same_state(embedding, plain, "after the last step")


@pytest.mark.slow
def test_a_checkpoint_between_prefetching_steps_continues_bit_for_bit(tmp_path):
    """Saved while the next batch is prefetched (its keys sent, not mapped): the restored
    embedding prefetches that batch again and continues like the uninterrupted loop."""
    rng = np.random.default_rng(3)
    batches = random_batches(rng, 6, key_values(rng, 20, tf.string))
    strategy = ph.make_strategy(2)
    original = make_embedding(strategy, tf.string)
    loop = Loop(original, strategy, tf.string)
    loop.prefetch(batches[0])
    for n in range(3):
        loop.step(batches[n], batches[n + 1])
    path = tf.train.Checkpoint(embedding=original).save(str(tmp_path / "ckpt"))
    # Saving reads the tables, which applies the kept update; the fixed table's prefetched
    # lookup was read before it (docs/pipelining.md#the-same-numbers), so prefetch it again,
    # as the restored run must.
    loop.prefetch(batches[3])
    want = [loop.step(batches[3], batches[4]), loop.step(batches[4], batches[5]),
            loop.step(batches[5])]

    restored = make_embedding(strategy, tf.string)
    tf.train.Checkpoint(embedding=restored).restore(path).assert_consumed()
    again = Loop(restored, strategy, tf.string)
    again.prefetch(batches[3])
    got = [again.step(batches[3], batches[4]), again.step(batches[4], batches[5]),
           again.step(batches[5])]
    assert_same_activations(got, want)
    assert_same_state(restored, original, "after the restored steps", counters=False)


@pytest.mark.slow
def test_inference_with_prefetching_reads_the_same_rows_and_changes_no_map():
    """training=False with next_features: the prefetch sends the keys, the consuming lookup only
    finds them (no count, admission or eviction), with the activations of plain inference."""
    rng = np.random.default_rng(4)
    keys = key_values(rng, 20, tf.int64)
    batches = random_batches(rng, 6, keys)
    strategy = ph.make_strategy(2)
    embedding = make_embedding(strategy, tf.int64)
    loop = Loop(embedding, strategy, tf.int64)
    loop.run(batches[:3], prefetch=False)
    before = embedding.dynamic_tables.logical_state("items")   # applies the kept update
    want = [loop.infer(b) for b in batches[3:]]
    loop.prefetch(batches[3])
    got = [loop.infer(batches[3], batches[4]), loop.infer(batches[4], batches[5]),
           loop.infer(batches[5])]
    assert_same_activations(got, want)
    after = embedding.dynamic_tables.logical_state("items")
    for part in MAP_STATE:
        np.testing.assert_array_equal(after[part], before[part], err_msg=part)


def _keys_state(embedding):
    state = embedding.dynamic_tables.logical_state("items")
    return {part: state[part] for part in KEYS_STATE}


def _assert_keys_state(embedding, want, where):
    for part, value in _keys_state(embedding).items():
        np.testing.assert_array_equal(value, want[part], err_msg=f"{where}: {part}")


def test_the_checks_guard_the_maps_with_only_open_vocabularies_on_one_replica():
    """One replica, no fixed table: nothing is prefetched but the batch's fingerprint, and the
    check of it still runs before the batch's keys are mapped (it forwards the batch)."""
    rng = np.random.default_rng(8)
    batches = [{k: v for k, v in b.items() if k != "f3"}
               for b in random_batches(rng, 4, key_values(rng, 16, tf.int64))]
    strategy = ph.make_strategy(1)
    embedding = make_embedding(strategy, tf.int64, fixed_table=False)
    loop = Loop(embedding, strategy, tf.int64)
    loop.prefetch(batches[0])
    loop.step(batches[0], batches[1])
    before = _keys_state(embedding)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not the batch prefetched"):
        loop.step(batches[2], batches[3])
    _assert_keys_state(embedding, before, "after the refused step")
    got = [loop.step(batches[1], batches[2]), loop.step(batches[2], batches[3]),
           loop.step(batches[3])]

    twin = make_embedding(strategy, tf.int64, fixed_table=False)
    twin_loop = Loop(twin, strategy, tf.int64)
    twin_loop.run(batches[:1], prefetch=False)
    _keys_state(twin)   # the same read (it applies the kept update)
    want = twin_loop.run(batches[1:], prefetch=False)
    assert_same_activations(got, want)
    np.testing.assert_array_equal(embedding.export_dynamic_table("items")[1],
                                  twin.export_dynamic_table("items")[1])


def test_a_bad_next_batch_fails_before_this_batch_is_mapped():
    """next_features with an id the fixed table cannot take: the step fails with every map as
    it was and uses up its prefetch; prefetching again goes on like a run without the failure."""
    rng = np.random.default_rng(9)
    batches = random_batches(rng, 3, key_values(rng, 16, tf.int64))
    bad = dict(batches[2], f3=[[2 ** 40]] * BATCH)
    strategy = ph.make_strategy(2)
    embedding = make_embedding(strategy, tf.int64)
    loop = Loop(embedding, strategy, tf.int64)
    loop.prefetch(batches[0])
    got = [loop.step(batches[0], batches[1])]
    before = _keys_state(embedding)
    with pytest.raises(tf.errors.InvalidArgumentError, match="above 2.31 - 1"):
        loop.step(batches[1], bad)
    _assert_keys_state(embedding, before, "after the failed step")
    with pytest.raises(tf.errors.InvalidArgumentError, match="no prefetched lookup"):
        loop.step(batches[1], batches[2])
    loop.prefetch(batches[1])
    got += [loop.step(batches[1], batches[2]), loop.step(batches[2])]

    twin = make_embedding(strategy, tf.int64)
    twin_loop = Loop(twin, strategy, tf.int64)
    want = twin_loop.run(batches[:1], prefetch=False)
    _keys_state(twin)
    want += twin_loop.run(batches[1:], prefetch=False)
    assert_same_activations(got, want)
    assert_same_state(embedding, twin, "after the last step")
