// Registration of the key-to-row map of an open-vocabulary table (docs/dynamic_vocabulary.md): a
// resource holding one shard's sce::KeyRowMap, and the ops that map a step's keys, export its
// logical state and import one. All of them are stateful: TensorFlow never prunes, dedups or
// reorders them apart from their handle's order.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

absl::Status VectorOutputs(InferenceContext* c, int first, int count) {
  for (int i = first; i < first + count; ++i) c->set_output(i, c->Vector(c->UnknownDim()));
  return absl::OkStatus();
}

// The owner shard of each key (sce::KeyOwnerShard): where a key's map and row live when an
// open-vocabulary table is sharded over num_shards replicas. String keys pass their fingerprints.
REGISTER_OP("SceKeyOwnerShards")
    .Input("keys: int64")
    .Output("owners: int32")
    .Attr("num_shards: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      c->set_output(0, keys);
      return absl::OkStatus();
    });

// A replica's keys of one table grouped for their owner shards (sce::GroupKeysByOwner, the first
// step of the key exchange): the distinct keys grouped by owner (owner 0's first, each owner's in
// order of first appearance), their occurrences, the distinct keys per owner [num_shards], and
// each key's index among the grouped keys. Int64 keys only: two strings may share a fingerprint,
// so string tables group their strings themselves.
REGISTER_OP("SceGroupKeysByOwner")
    .Input("keys: int64")
    .Output("grouped_keys: int64")
    .Output("occurrences: int32")
    .Output("owner_counts: int32")
    .Output("positions: int32")
    .Attr("num_shards: int >= 1")
    .Attr("table_name: string = ''")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      int64_t num_shards;
      TF_RETURN_IF_ERROR(c->GetAttr("num_shards", &num_shards));
      TF_RETURN_IF_ERROR(VectorOutputs(c, 0, 2));
      c->set_output(2, c->Vector(num_shards));
      c->set_output(3, keys);
      return absl::OkStatus();
    });

// The owner's side of the key exchange (sce::RepeatIndices): for keys received with their
// occurrence counts, the index of the key of every occurrence, key k repeated counts[k] times in
// order. Counts must be >= 0.
REGISTER_OP("SceRepeatIndices")
    .Input("counts: int32")
    .Output("indices: int32")
    .Attr("table_name: string = ''")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle counts;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &counts));
      return VectorOutputs(c, 0, 1);
    });

// The initial values of rows given to new keys: [n, width], element (i, j) a function of (seed,
// keys[i], j) only (sce::KeyedRandomRows), so a row's values depend on its key, not on the step,
// the shard or the order of admission. distribution: "uniform" (a = low, b = high), "normal" or
// "truncated_normal" (a = mean, b = stddev; truncated at two standard deviations).
REGISTER_OP("SceKeyedRandomRows")
    .Input("keys: int64")
    .Output("values: float32")
    .Attr("seed: int")
    .Attr("width: int >= 0")
    .Attr("distribution: {'uniform', 'normal', 'truncated_normal'}")
    .Attr("a: float")
    .Attr("b: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &keys));
      int64_t width;
      TF_RETURN_IF_ERROR(c->GetAttr("width", &width));
      c->set_output(0, c->Matrix(c->Dim(keys, 0), width));
      return absl::OkStatus();
    });

// The handle of one shard's map, created on first use from the attributes. A second op naming
// the same (container, shared_name) must give the same configuration. total_rows / first_row:
// the rows of the whole table over every shard's map (0: capacity) and this map's first own row
// among them; every row an op gives or takes is a row of the whole table.
REGISTER_OP("SceKeyRowMap")
    .Output("handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string")
    .Attr("table_name: string")
    .Attr("capacity: int")
    .Attr("admission_threshold: int = 1")
    .Attr("steps_to_live: int = 0")
    .Attr("pending_capacity: int = 1")
    .Attr("total_rows: int = 0")
    .Attr("first_row: int = 0")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);

// Maps one step's keys (int64, any values): rows[i] is keys[i]'s row or -1 (no row: the
// occurrence reads zeros and trains nothing). new_keys / new_rows: the keys given a row in this
// step and their rows, whose table values and slots the caller initializes before reading them.
// stats: admitted keys, evicted keys, refused keys, unadmitted ids, untracked ids.
// wait=true: keys left without a row when every row is taken wait for <prefix>FinishStep, which
// ends the step (docs/dynamic_vocabulary.md#capacity-over-several-replicas); `rows` are then the
// map's own numbering, only for FinishStep, and new_rows / stats describe this part only.
REGISTER_OP("SceKeyRowMapStep")
    .Input("handle: resource")
    .Input("keys: int64")
    .Input("step: int64")
    .Attr("wait: bool = false")
    .Output("rows: int32")
    .Output("new_keys: int64")
    .Output("new_rows: int32")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys, step;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &step));
      c->set_output(0, keys);
      TF_RETURN_IF_ERROR(VectorOutputs(c, 1, 2));
      c->set_output(3, c->Vector(5));
      return absl::OkStatus();
    });

// The rows given to keys and not yet confirmed reset (KeyRowMap::rows_to_reset), in admission
// order, with the key each was given to (a string map's fingerprint; keys_to_reset), from which
// its initial values are drawn; <prefix>ConfirmReset removes the first `count` of them once the caller has
// (re)initialized them. The same pair for both key dtypes' maps (prefix SceKeyRowMap and
// SceStringKeyRowMap): both reset the rows of the key map inside.
#define SCE_REGISTER_RESET_OPS(prefix)                                             \
  REGISTER_OP(prefix "RowsToReset")                                                \
      .Input("handle: resource")                                                   \
      .Output("rows: int32")                                                       \
      .Output("keys: int64")                                                       \
      .SetIsStateful()                                                             \
      .SetShapeFn([](InferenceContext* c) { return VectorOutputs(c, 0, 2); });     \
  REGISTER_OP(prefix "ConfirmReset")                                               \
      .Input("handle: resource")                                                   \
      .Input("count: int32")                                                       \
      .SetIsStateful()                                                             \
      .SetShapeFn([](InferenceContext* c) {                                        \
        ShapeHandle count;                                                         \
        return c->WithRank(c->input(1), 0, &count);                                \
      })
SCE_REGISTER_RESET_OPS("SceKeyRowMap");
SCE_REGISTER_RESET_OPS("SceStringKeyRowMap");
#undef SCE_REGISTER_RESET_OPS

// Between a Step(wait=true) and its FinishStep: <prefix>Lendable gives [keys waiting for a row,
// rows the map can still give] (rows of expired keys taken back first); <prefix>LendRows gives
// `count` of those rows to another shard's map (they leave this one), as rows of the whole table.
#define SCE_REGISTER_LENDING_OPS(prefix)                                           \
  REGISTER_OP(prefix "Lendable")                                                   \
      .Input("handle: resource")                                                   \
      .Output("counts: int64")                                                     \
      .SetIsStateful()                                                             \
      .SetShapeFn([](InferenceContext* c) {                                        \
        c->set_output(0, c->Vector(2));                                            \
        return absl::OkStatus();                                                   \
      });                                                                          \
  REGISTER_OP(prefix "LendRows")                                                   \
      .Input("handle: resource")                                                   \
      .Input("count: int64")                                                       \
      .Output("rows: int32")                                                       \
      .SetIsStateful()                                                             \
      .SetShapeFn([](InferenceContext* c) {                                        \
        ShapeHandle count;                                                         \
        TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &count));                   \
        return VectorOutputs(c, 0, 1);                                             \
      })
SCE_REGISTER_LENDING_OPS("SceKeyRowMap");
SCE_REGISTER_LENDING_OPS("SceStringKeyRowMap");
#undef SCE_REGISTER_LENDING_OPS

// Ends a SceKeyRowMapStep(wait=true), given the same keys, its rows and the rows other shards
// lent this map (`lent`): the waiting keys take them in order, the others are refused. Outputs
// as SceKeyRowMapStep's, for this part of the step.
REGISTER_OP("SceKeyRowMapFinishStep")
    .Input("handle: resource")
    .Input("lent: int32")
    .Input("keys: int64")
    .Input("rows: int32")
    .Output("finished_rows: int32")
    .Output("new_keys: int64")
    .Output("new_rows: int32")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle lent, keys, rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &lent));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &rows));
      TF_RETURN_IF_ERROR(c->Merge(keys, rows, &keys));
      c->set_output(0, keys);
      TF_RETURN_IF_ERROR(VectorOutputs(c, 1, 2));
      c->set_output(3, c->Vector(5));
      return absl::OkStatus();
    });

// The distinct rows of the map's last step (KeyRowMap::NumberStepRows): `rows` are that step's
// answers (or some of them, -1 included); positions[i] is the index of rows[i] in unique_rows,
// which holds each distinct row once in order of first occurrence (-1 once, if it occurs). A
// row not given in the last step fails, naming the table. The map is unchanged.
#define SCE_REGISTER_NUMBER_ROWS_OP(prefix)                                        \
  REGISTER_OP(prefix "NumberRows")                                                 \
      .Input("handle: resource")                                                   \
      .Input("rows: int32")                                                        \
      .Output("positions: int32")                                                  \
      .Output("unique_rows: int32")                                                \
      .SetIsStateful()                                                             \
      .SetShapeFn([](InferenceContext* c) {                                        \
        ShapeHandle rows;                                                          \
        TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &rows));                    \
        c->set_output(0, rows);                                                    \
        c->set_output(1, c->Vector(InferenceContext::kUnknownDim));                \
        return absl::OkStatus();                                                   \
      })
SCE_REGISTER_NUMBER_ROWS_OP("SceKeyRowMap");
SCE_REGISTER_NUMBER_ROWS_OP("SceStringKeyRowMap");
#undef SCE_REGISTER_NUMBER_ROWS_OP

// Read-only lookup (inference): each key's row, or -1 when it holds none at the last step. No
// count, admission or eviction: the map is unchanged.
REGISTER_OP("SceKeyRowMapFind")
    .Input("handle: resource")
    .Input("keys: int64")
    .Output("rows: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
      c->set_output(0, keys);
      return absl::OkStatus();
    });

// The logical state (docs/dynamic_vocabulary.md#logical-state): keys holding rows in ascending
// order with their rows and last-seen steps, the pending keys with their counts and last-seen
// steps, and the last mapped step.
REGISTER_OP("SceKeyRowMapExport")
    .Input("handle: resource")
    .Output("last_step: int64")
    .Output("keys: int64")
    .Output("rows: int32")
    .Output("last_seen: int32")
    .Output("pending_keys: int64")
    .Output("pending_counts: int32")
    .Output("pending_last_seen: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return VectorOutputs(c, 1, 6);
    });

// Replaces the state with a logical one (as exported); keys[i] gets the map's own row i, or, with
// placed=true, the row placement_rows[i] of the whole table, lent_rows being the map's own rows
// that other shards' keys hold (KeyRowMap::Import). Everything is checked first; on error the
// map is unchanged.
REGISTER_OP("SceKeyRowMapImport")
    .Input("handle: resource")
    .Input("last_step: int64")
    .Input("keys: int64")
    .Input("last_seen: int32")
    .Input("pending_keys: int64")
    .Input("pending_counts: int32")
    .Input("pending_last_seen: int32")
    .Input("placement_rows: int32")
    .Input("lent_rows: int32")
    .Attr("placed: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      for (int i = 2; i < 9; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
      return absl::OkStatus();
    });

// [keys holding rows (swept or not), pending keys, last mapped step].
REGISTER_OP("SceKeyRowMapSize")
    .Input("handle: resource")
    .Output("sizes: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(3));
      return absl::OkStatus();
    });

// ---- String keys (docs/dynamic_vocabulary.md#string-keys) ------------------------------------

// As SceKeyRowMap, for string keys.
REGISTER_OP("SceStringKeyRowMap")
    .Output("handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string")
    .Attr("table_name: string")
    .Attr("capacity: int")
    .Attr("admission_threshold: int = 1")
    .Attr("steps_to_live: int = 0")
    .Attr("pending_capacity: int = 1")
    .Attr("total_rows: int = 0")
    .Attr("first_row: int = 0")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);

// As SceKeyRowMapStep, for string keys with their 64-bit fingerprints (tf.fingerprint). stats
// has a sixth entry: occurrences refused because another string holds their fingerprint's row.
REGISTER_OP("SceStringKeyRowMapStep")
    .Input("handle: resource")
    .Input("keys: string")
    .Input("fingerprints: int64")
    .Input("step: int64")
    .Attr("wait: bool = false")
    .Output("rows: int32")
    .Output("new_keys: string")
    .Output("new_rows: int32")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys, fingerprints, step;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &fingerprints));
      TF_RETURN_IF_ERROR(c->Merge(keys, fingerprints, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 0, &step));
      c->set_output(0, keys);
      TF_RETURN_IF_ERROR(VectorOutputs(c, 1, 2));
      c->set_output(3, c->Vector(6));
      return absl::OkStatus();
    });

// As SceKeyRowMapFinishStep, for string keys.
REGISTER_OP("SceStringKeyRowMapFinishStep")
    .Input("handle: resource")
    .Input("lent: int32")
    .Input("keys: string")
    .Input("fingerprints: int64")
    .Input("rows: int32")
    .Output("finished_rows: int32")
    .Output("new_keys: string")
    .Output("new_rows: int32")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle lent, keys, fingerprints, rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &lent));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &fingerprints));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &rows));
      TF_RETURN_IF_ERROR(c->Merge(keys, fingerprints, &keys));
      TF_RETURN_IF_ERROR(c->Merge(keys, rows, &keys));
      c->set_output(0, keys);
      TF_RETURN_IF_ERROR(VectorOutputs(c, 1, 2));
      c->set_output(3, c->Vector(6));
      return absl::OkStatus();
    });

// Read-only lookup of string keys (SceKeyRowMapFind's rules; a string whose fingerprint another
// string holds reads -1).
REGISTER_OP("SceStringKeyRowMapFind")
    .Input("handle: resource")
    .Input("keys: string")
    .Input("fingerprints: int64")
    .Output("rows: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys, fingerprints;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &fingerprints));
      TF_RETURN_IF_ERROR(c->Merge(keys, fingerprints, &keys));
      c->set_output(0, keys);
      return absl::OkStatus();
    });

// The logical state: held keys ascending by bytes with their fingerprints, rows and last-seen
// steps; pending counts per fingerprint.
REGISTER_OP("SceStringKeyRowMapExport")
    .Input("handle: resource")
    .Output("last_step: int64")
    .Output("keys: string")
    .Output("fingerprints: int64")
    .Output("rows: int32")
    .Output("last_seen: int32")
    .Output("pending_fingerprints: int64")
    .Output("pending_counts: int32")
    .Output("pending_last_seen: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return VectorOutputs(c, 1, 7);
    });

// Replaces the state; the key with the i-th smallest fingerprint gets the map's own row i, or
// with placed=true keys[i] gets placement_rows[i] (as SceKeyRowMapImport).
REGISTER_OP("SceStringKeyRowMapImport")
    .Input("handle: resource")
    .Input("last_step: int64")
    .Input("keys: string")
    .Input("fingerprints: int64")
    .Input("last_seen: int32")
    .Input("pending_fingerprints: int64")
    .Input("pending_counts: int32")
    .Input("pending_last_seen: int32")
    .Input("placement_rows: int32")
    .Input("lent_rows: int32")
    .Attr("placed: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      for (int i = 2; i < 10; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
      return absl::OkStatus();
    });

REGISTER_OP("SceStringKeyRowMapSize")
    .Input("handle: resource")
    .Output("sizes: int64")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(3));
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tensorflow
