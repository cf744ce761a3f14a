// Unit tests of cc/core (no TensorFlow, no gtest) against worked examples of the rules in docs/
// (docs/layout.md#table-layout, docs/preprocessing.md#host-preprocessing). Every CHECK counts one pass or one failure; failures are
// printed with file:line and both values. The program prints "N passed, N failed" and exits
// non-zero if anything failed.
//
// Build and run: `bazel test //cc/tests:core_test` or `bash cc/tests/run_core_tests.sh`.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <cpuid.h>
#include <immintrin.h>

#include "cc/core/adjacent_merge.h"
#include "cc/core/checked_math.h"
#include "cc/core/constants.h"
#include "cc/core/coo.h"
#include "cc/core/csr.h"
#include "cc/core/csr_view.h"
#include "cc/core/fused_update.h"
#include "cc/core/gathered_segment_sum.h"
#include "cc/core/gradient_check.h"
#include "cc/core/grouped_entries.h"
#include "cc/core/huge_pages.h"
#include "cc/core/id_routing.h"
#include "cc/core/key_grouping.h"
#include "cc/core/key_row_map.h"
#include "cc/core/key_values.h"
#include "cc/core/string_key_row_map.h"
#include "cc/core/lookup.h"
#include "cc/core/sample_major_order.h"
#include "cc/core/layout.h"
#include "cc/core/minibatch_splits.h"
#include "cc/core/online_limits.h"
#include "cc/core/owner_csr.h"
#include "cc/core/radix_sort.h"
#include "cc/core/range_scan.h"
#include "cc/core/replica_chunks.h"
#include "cc/core/row_precision.h"
#include "cc/core/sort_list.h"
#include "cc/core/split_encoding.h"
#include "cc/core/stacked_coo.h"
#include "cc/core/stacked_splits.h"
#include "cc/core/status.h"
#include "cc/tests/fused_update_reference.h"
#include "cc/tests/key_row_map_reference.h"

namespace {

int g_passed = 0;
int g_failed = 0;
const char* g_test = "";

template <typename T>
std::string Str(const T& value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

template <typename T>
std::string Str(const std::vector<T>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << values[i];
  out << "]";
  return out.str();
}

void Report(bool ok, const char* file, int line, const std::string& what) {
  if (ok) {
    ++g_passed;
    return;
  }
  ++g_failed;
  std::fprintf(stderr, "%s:%d: [%s] CHECK failed: %s\n", file, line, g_test, what.c_str());
}

template <typename A, typename B>
void CheckEq(const A& a, const B& b, const char* ea, const char* eb, const char* file, int line) {
  const bool ok = (a == b);
  Report(ok, file, line,
         ok ? std::string() : std::string(ea) + " == " + eb + "\n    got      " + Str(a) +
                                  "\n    expected " + Str(b));
}

// Relative tolerance for float results the spec prints with ~8 significant digits.
void CheckNear(const std::vector<float>& got, const std::vector<double>& want, const char* eg,
               const char* ew, const char* file, int line) {
  bool ok = got.size() == want.size();
  for (size_t i = 0; ok && i < got.size(); ++i) {
    ok = std::fabs(got[i] - want[i]) <= 1e-6 * std::max(1.0, std::fabs(want[i]));
  }
  Report(ok, file, line,
         ok ? std::string() : std::string(eg) + " ~= " + ew + "\n    got      " + Str(got) +
                                  "\n    expected " + Str(want));
}

#define CHECK(cond) Report((cond), __FILE__, __LINE__, #cond)
#define CHECK_EQ(a, b) CheckEq((a), (b), #a, #b, __FILE__, __LINE__)
#define CHECK_NEAR(got, ...) \
  CheckNear((got), std::vector<double>(__VA_ARGS__), #got, #__VA_ARGS__, __FILE__, __LINE__)
#define CHECK_OK(expr)                                                                   \
  do {                                                                                   \
    const ::sce::Status _s = (expr);                                                     \
    Report(_s.ok(), __FILE__, __LINE__, std::string(#expr) + " returned error: " + _s.message()); \
  } while (0)
// Expects an error whose message contains `substring`.
#define CHECK_ERROR(expr, substring)                                                          \
  do {                                                                                        \
    const ::sce::Status _s = (expr);                                                          \
    Report(!_s.ok() && _s.message().find(substring) != std::string::npos, __FILE__, __LINE__, \
           std::string(#expr) + " should fail with a message containing '" + (substring) +    \
               "', got " + (_s.ok() ? std::string("OK") : "'" + _s.message() + "'"));        \
  } while (0)

using IntVec = std::vector<int32_t>;
using FloatVec = std::vector<float>;

const int32_t PAD = sce::kPad;
const float FPAD = static_cast<float>(sce::kPad);  // 2147483648.0f

sce::IdInput Ragged(const IntVec& row_splits, const IntVec& values, const FloatVec& weights) {
  sce::IdInput in;
  in.index_data = row_splits.data();
  in.index_rank = 1;
  in.index_dim0 = static_cast<int64_t>(row_splits.size());
  in.values = values.data();
  in.num_values = static_cast<int64_t>(values.size());
  in.weights = weights.data();
  in.weights_rank = weights.size() == 1 && values.size() != 1 ? 0 : 1;
  in.num_weights = static_cast<int64_t>(weights.size());
  return in;
}

// `indices` is row-major [n, 2].
sce::IdInput Sparse(const IntVec& indices, const IntVec& values, const FloatVec& weights) {
  sce::IdInput in = Ragged(indices, values, weights);
  in.index_rank = 2;
  in.index_dim0 = static_cast<int64_t>(indices.size() / 2);
  in.index_dim1 = 2;
  return in;
}

sce::IdInput Dense(const IntVec& values, const FloatVec& weights) {
  sce::IdInput in = Ragged({}, values, weights);
  in.index_data = nullptr;
  in.index_dim0 = 0;
  return in;
}

// "[a, b, c, ...]" in the spec: the listed prefix, then the last listed value repeated.
IntVec Block(IntVec prefix, size_t size = 8) {
  while (prefix.size() < size) prefix.push_back(prefix.back());
  return prefix;
}

IntVec Slice(const int32_t* data, int64_t begin, int64_t end) {
  return IntVec(data + begin, data + end);
}

// Output buffers of PackCsr*: pointers and the allocated sizes.
sce::CsrBuffers Bind(IntVec* row_pointers, IntVec* samples, IntVec* tokens, FloatVec* gains) {
  sce::CsrBuffers out;
  out.row_pointers = row_pointers->data();
  out.sample_ids = samples->data();
  out.token_ids = tokens->data();
  out.gains = gains->data();
  out.row_pointer_buffer_size = static_cast<int64_t>(row_pointers->size());
  out.id_buffer_size = static_cast<int64_t>(tokens->size());
  return out;
}

// ------------------------------------------------------------------------------------------------
// docs/preprocessing.md#coo-conversion ConvertToCooTensor
// ------------------------------------------------------------------------------------------------

const IntVec kRowSplits4 = {0, 4, 4, 6, 8};
const IntVec kIndices4 = {0, 0, 0, 1, 0, 2, 0, 3, 2, 0, 2, 1, 3, 0, 3, 1};
const IntVec kValues4 = {5, 5, 2, 5, 7, 3, 1, 1};
const FloatVec kWeights4 = {1, 2, 1, 1, .5f, .5f, 1, 3};

void TestConvertToCoo() {
  g_test = "ConvertToCoo docs/preprocessing.md#coo-conversion";
  struct Case {
    const char* combiner;
    std::vector<double> gains;
  };
  const std::vector<Case> cases = {
      {"sum", {3, 1, 1, 0.5, 0.5, 4}},
      {"mean", {0.6, 0.2, 0.2, 0.5, 0.5, 1.0}},
      {"sqrtn", {1.1338935, 0.3779645, 0.3779645, 0.70710677, 0.70710677, 1.2649111}},
  };
  const sce::Context ctx{"t", "f"};
  for (const Case& c : cases) {
    sce::Combiner combiner;
    CHECK_OK(sce::ParseCombiner(c.combiner, &combiner));
    sce::CooEntries ragged, sparse;
    CHECK_OK(sce::ConvertToCoo(Ragged(kRowSplits4, kValues4, kWeights4), 4, combiner, -1, ctx,
                               &ragged));
    CHECK_EQ(ragged.rows, (IntVec{0, 0, 0, 2, 2, 3}));
    CHECK_EQ(ragged.cols, (IntVec{5, 2, 5, 7, 3, 1}));
    CHECK_NEAR(ragged.gains, c.gains);
    // The SparseTensor form gives bit-identical output.
    CHECK_OK(sce::ConvertToCoo(Sparse(kIndices4, kValues4, kWeights4), 4, combiner, -1, ctx,
                               &sparse));
    CHECK_EQ(sparse.rows, ragged.rows);
    CHECK_EQ(sparse.cols, ragged.cols);
    CHECK_EQ(sparse.gains, ragged.gains);
    // A vocabulary that holds every id passes the range check with the same result.
    sce::CooEntries checked;
    CHECK_OK(sce::ConvertToCoo(Ragged(kRowSplits4, kValues4, kWeights4), 4, combiner, 8, ctx,
                               &checked));
    CHECK_EQ(checked.gains, ragged.gains);
  }

  g_test = "ConvertToCoo docs/preprocessing.md#coo-conversion dense";
  sce::CooEntries dense;
  CHECK_OK(sce::ConvertToCoo(Dense({5, 5, 2, 9}, {1.0f}), 4, sce::Combiner::kMean, -1, ctx,
                             &dense));
  CHECK_EQ(dense.rows, (IntVec{0, 1, 2, 3}));
  CHECK_EQ(dense.cols, (IntVec{5, 5, 2, 9}));
  CHECK_EQ(dense.gains, (FloatVec{1, 1, 1, 1}));

  g_test = "ConvertToCoo docs/preprocessing.md#adjacent-merge adjacent-only merge";
  sce::CooEntries merged;
  CHECK_OK(sce::ConvertToCoo(Ragged({0, 3}, {5, 2, 5}, {1.0f}), 1, sce::Combiner::kSum, -1, ctx,
                             &merged));
  CHECK_EQ(merged.cols, (IntVec{5, 2, 5}));
  CHECK_EQ(merged.gains, (FloatVec{1, 1, 1}));

  g_test = "ConvertToCoo errors";
  sce::CooEntries out;
  sce::Combiner combiner;
  CHECK_ERROR(sce::ParseCombiner("max", &combiner), "combiner");
  CHECK_ERROR(sce::ConvertToCoo(Ragged({0, 2, 3}, {1, -4, 2}, {1.0f}), 2, sce::Combiner::kSum, -1,
                                ctx, &out),
              "negative");
  CHECK_ERROR(sce::ConvertToCoo(Ragged({0, 2, 3}, {1, 4, 2}, {1.0f}), 2, sce::Combiner::kSum, 4,
                                ctx, &out),
              "out of range");
  // The sum combiner's one-pass conversion flags bad ids as it merges: negative ids fail against
  // any vocabulary (also one beyond 2^32), in every input form, with the first bad position.
  for (int64_t vocabulary : {int64_t{-1}, int64_t{8}, int64_t{1} << 40}) {
    CHECK_ERROR(sce::ConvertToCoo(Ragged({0, 2, 3}, {1, -1, -4}, {1.0f, 1.0f, 1.0f}), 2,
                                  sce::Combiner::kSum, vocabulary, ctx, &out),
                "id -1 at position 1");
    CHECK_ERROR(sce::ConvertToCoo(Sparse({0, 0, 0, 1, 1, 0}, {1, 2, -3}, {1.0f}), 2,
                                  sce::Combiner::kSum, vocabulary, ctx, &out),
                "id -3 at position 2");
    CHECK_ERROR(sce::ConvertToCoo(Dense({-2, 1}, {1.0f}), 2, sce::Combiner::kSum, vocabulary, ctx,
                                  &out),
                "id -2 at position 0");
  }
  CHECK_ERROR(sce::ConvertToCoo(Ragged({0, 2, 3}, {7, 8, 9}, {1.0f}), 2, sce::Combiner::kSum, 8,
                                ctx, &out),
              "id 8 at position 1 is out of range [0, 8)");
  CHECK_OK(sce::ConvertToCoo(Ragged({0, 2, 3}, {7, 2147483647, 9}, {1.0f}), 2,
                             sce::Combiner::kSum, int64_t{1} << 40, ctx, &out));
  // Empty samples anywhere (first, between, last) leave the samples of the others unchanged.
  CHECK_OK(sce::ConvertToCoo(Ragged({0, 0, 2, 2, 2, 5, 5}, {3, 3, 1, 1, 2}, {1.0f}), 6,
                             sce::Combiner::kSum, -1, ctx, &out));
  CHECK_EQ(out.rows, (IntVec{1, 4, 4}));
  CHECK_EQ(out.cols, (IntVec{3, 1, 2}));
  CHECK_EQ(out.gains, (FloatVec{2, 2, 1}));
  CHECK_ERROR(sce::ConvertToCoo(Ragged({0, 3, 2, 4}, {1, 2, 3, 4}, {1.0f}), 3, sce::Combiner::kSum,
                                -1, ctx, &out),
              "non-decreasing");
  CHECK_ERROR(sce::ConvertToCoo(Ragged({1, 2, 4}, {1, 2, 3, 4}, {1.0f}), 2, sce::Combiner::kSum,
                                -1, ctx, &out),
              "start at 0");
  CHECK_ERROR(sce::ConvertToCoo(Ragged({0, 2, 4}, {1, 2, 3, 4}, {1.0f}), 3, sce::Combiner::kSum,
                                -1, ctx, &out),
              "row_splits");
  CHECK_ERROR(sce::ConvertToCoo(Sparse({1, 0, 0, 0}, {1, 2}, {1.0f}), 2, sce::Combiner::kSum, -1,
                                ctx, &out),
              "sorted");
  CHECK_ERROR(sce::ConvertToCoo(Sparse({0, 0, 2, 0}, {1, 2}, {1.0f}), 2, sce::Combiner::kSum, -1,
                                ctx, &out),
              "sample_count");
  CHECK_ERROR(sce::ConvertToCoo(Dense({1, 2, 3}, {1.0f}), 4, sce::Combiner::kSum, -1, ctx, &out),
              "dense");
  CHECK_ERROR(sce::ConvertToCoo(Ragged({0, 2}, {1, 2}, {1, 1, 1}), 1, sce::Combiner::kSum, -1, ctx,
                                &out),
              "weights");
}

// ------------------------------------------------------------------------------------------------
// docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform / docs/preprocessing.md#sort-dedup-and-bucket / docs/preprocessing.md#id-statistics / docs/preprocessing.md#csr-wrapped-coo-buffers: the user/video stacked table, C = 2, S = 4, N = P = 8.
// ------------------------------------------------------------------------------------------------

constexpr int64_t kChips = 2;
constexpr int64_t kScPerChip = 4;

const IntVec kUserSplits = {0, 1, 3, 3, 4, 5, 5, 6, 7};
const IntVec kUserValues = {0, 32, 1, 0, 9, 0, 0};
const IntVec kVideoSplits = {0, 1, 3, 3, 4, 5, 6, 7, 8};
const IntVec kVideoValues = {3, 10, 3, 99, 0, 17, 3, 8};
const FloatVec kOne = {1.0f};

sce::StackingTransform UserTransform() {
  sce::StackingTransform t;
  t.num_sc_per_chip = kScPerChip;
  t.row_offset = 0;
  t.col_offset = 0;
  t.col_shift = 0;
  t.num_sc_shards = kChips * kScPerChip;
  t.stacked_table_sample_count = 16;
  return t;
}

sce::StackingTransform VideoTransform() {
  sce::StackingTransform t = UserTransform();
  t.row_offset = 8;
  t.col_offset = 64;
  t.col_shift = 4;
  return t;
}

struct UserVideo {
  std::vector<sce::CooEntries> user, video;  // per source SC
};

bool BuildUserVideo(UserVideo* uv) {
  const sce::Status a =
      sce::ConvertToListOfCoo(Ragged(kUserSplits, kUserValues, kOne), 8, sce::Combiner::kSum,
                              UserTransform(), 33, {"user", "f_user"}, &uv->user);
  const sce::Status b =
      sce::ConvertToListOfCoo(Ragged(kVideoSplits, kVideoValues, kOne), 8, sce::Combiner::kSum,
                              VideoTransform(), 100, {"video", "f_video"}, &uv->video);
  return a.ok() && b.ok() && uv->user.size() == 4 && uv->video.size() == 4;
}

void TestConvertToListOfCoo() {
  g_test = "ConvertToListOfCoo docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform";
  UserVideo uv;
  CHECK(BuildUserVideo(&uv));
  if (uv.user.size() != 4 || uv.video.size() != 4) return;
  const std::vector<IntVec> user_rows = {{0, 1, 1}, {5}, {8}, {12, 13}};
  const std::vector<IntVec> user_cols = {{0, 32, 1}, {0}, {9}, {0, 0}};
  const std::vector<IntVec> video_rows = {{2, 3, 3}, {7}, {10, 11}, {14, 15}};
  const std::vector<IntVec> video_cols = {{71, 78, 71}, {167}, {68, 85}, {71, 76}};
  for (int sc = 0; sc < 4; ++sc) {
    CHECK_EQ(uv.user[sc].rows, user_rows[sc]);
    CHECK_EQ(uv.user[sc].cols, user_cols[sc]);
    CHECK_EQ(uv.user[sc].gains, FloatVec(user_rows[sc].size(), 1.0f));
    CHECK_EQ(uv.video[sc].rows, video_rows[sc]);
    CHECK_EQ(uv.video[sc].cols, video_cols[sc]);
    CHECK_EQ(uv.video[sc].gains, FloatVec(video_rows[sc].size(), 1.0f));
  }

  g_test = "ConvertToListOfCoo docs/preprocessing.md#per-sparsecore-lists-and-the-stacking-transform video col transform";
  // raw id -> col' (shard (id + 4) mod 8, row in shard 8 + id / 8).
  const IntVec raw = {3, 10, 99, 0, 17, 8};
  const IntVec want = {71, 78, 167, 68, 85, 76};
  for (size_t i = 0; i < raw.size(); ++i) {
    std::vector<sce::CooEntries> per_sc;
    CHECK_OK(sce::ConvertToListOfCoo(Ragged({0, 1, 1, 1, 1, 1, 1, 1, 1}, {raw[i]}, kOne), 8,
                                     sce::Combiner::kSum, VideoTransform(), 100, {}, &per_sc));
    CHECK_EQ(per_sc.size(), size_t{4});
    if (per_sc.size() == 4) CHECK_EQ(per_sc[0].cols, (IntVec{want[i]}));
    CHECK_EQ(want[i] % 8, (raw[i] + 4) % 8);
    CHECK_EQ(want[i] / 8, 8 + raw[i] / 8);
  }

  g_test = "ConvertToListOfCoo errors";
  std::vector<sce::CooEntries> per_sc;
  sce::StackingTransform bad = UserTransform();
  bad.num_sc_shards = 6;
  CHECK_ERROR(sce::ConvertToListOfCoo(Ragged(kUserSplits, kUserValues, kOne), 8,
                                      sce::Combiner::kSum, bad, -1, {}, &per_sc),
              "power of two");
  CHECK_ERROR(sce::ConvertToListOfCoo(Ragged(kUserSplits, {0, 32, 1, 0, -9, 0, 0}, kOne), 8,
                                      sce::Combiner::kSum, UserTransform(), -1, {}, &per_sc),
              "negative");
  CHECK_ERROR(sce::ConvertToListOfCoo(Ragged(kUserSplits, kUserValues, kOne), 8,
                                      sce::Combiner::kSum, UserTransform(), 32, {}, &per_sc),
              "out of range");
}

std::vector<sce::FeatureCooView> ViewsForSc(const UserVideo& uv, int sc) {
  std::vector<sce::FeatureCooView> views;
  const sce::CooEntries* entries[2] = {&uv.user[sc], &uv.video[sc]};
  const int64_t col_offsets[2] = {0, 64};
  for (int f = 0; f < 2; ++f) {
    sce::FeatureCooView v;
    v.rows = entries[f]->rows.data();
    v.cols = entries[f]->cols.data();
    v.gains = entries[f]->gains.data();
    v.num_rows = v.num_cols = v.num_gains = static_cast<int64_t>(entries[f]->size());
    v.sample_count = 2;  // B_f / S
    v.col_offset = col_offsets[f];
    views.push_back(v);
  }
  return views;
}

bool SortAll(const UserVideo& uv, std::vector<sce::SortedCoo>* sorted) {
  sorted->assign(4, sce::SortedCoo());
  bool ok = true;
  for (int sc = 0; sc < 4; ++sc) {
    ok = ok && sce::SortListOfCoo(ViewsForSc(uv, sc), kChips, kScPerChip, 256, 256, "user_video",
                                  &(*sorted)[sc])
                   .ok();
  }
  return ok;
}

void TestSortListOfCoo() {
  g_test = "SortListOfCoo docs/preprocessing.md#sort-dedup-and-bucket";
  UserVideo uv;
  CHECK(BuildUserVideo(&uv));
  if (uv.user.size() != 4 || uv.video.size() != 4) return;
  std::vector<sce::SortedCoo> sorted;
  CHECK(SortAll(uv, &sorted));
  const std::vector<IntVec> rows = {{0, 1, 1, 3, 2, 3}, {1, 3}, {0, 2, 3}, {0, 1, 3, 2}};
  const std::vector<IntVec> cols = {{0, 4, 0, 9, 8, 8}, {0, 20}, {1, 8, 10}, {0, 0, 9, 8}};
  const std::vector<IntVec> id_counts = {{0, 2, 3, 3, 3, 3, 3, 4, 6},
                                         {0, 1, 1, 1, 1, 1, 1, 1, 2},
                                         {0, 0, 1, 1, 1, 2, 3, 3, 3},
                                         {0, 2, 2, 2, 2, 3, 3, 3, 4}};
  for (int sc = 0; sc < 4; ++sc) {
    CHECK_EQ(sorted[sc].rows, rows[sc]);
    CHECK_EQ(sorted[sc].cols, cols[sc]);
    CHECK_EQ(sorted[sc].id_counts, id_counts[sc]);
    CHECK_EQ(sorted[sc].gains, FloatVec(rows[sc].size(), 1.0f));
  }

  g_test = "GetStatsFromListOfSparseCoreCooTensors docs/preprocessing.md#id-statistics (SC0)";
  sce::ShardCounts counts;
  CHECK_OK(sce::CountIdsPerShard(ViewsForSc(uv, 0), kChips, kScPerChip, "user_video", &counts));
  CHECK_EQ(counts.ids, (std::vector<int64_t>{2, 1, 0, 0, 0, 0, 1, 2}));
  CHECK_EQ(counts.uniques, (std::vector<int64_t>{2, 1, 0, 0, 0, 0, 1, 1}));

  g_test = "SortListOfCoo docs/preprocessing.md#sort-dedup-and-bucket dedup merges into the first occurrence";
  // Two features of the same member table (same col_offset) on one SC; (row 1, col 8) appears
  // in both and (row 0, col 3) twice in the first. P = 8.
  const IntVec r1 = {0, 0, 1}, c1 = {3, 3, 8};
  const FloatVec g1 = {1, 2, 4};
  const IntVec r2 = {1, 2}, c2 = {8, 3};
  const FloatVec g2 = {8, 16};
  std::vector<sce::FeatureCooView> views(2);
  views[0] = {r1.data(), c1.data(), g1.data(), 3, 3, 3, 2, 0};
  views[1] = {r2.data(), c2.data(), g2.data(), 2, 2, 2, 2, 0};
  sce::SortedCoo dedup;
  CHECK_OK(sce::SortListOfCoo(views, kChips, kScPerChip, 256, 256, "t", &dedup));
  CHECK_EQ(dedup.rows, (IntVec{1, 0, 2}));  // shard 0: (8, r1); shard 3: (3, r0), (3, r2)
  CHECK_EQ(dedup.cols, (IntVec{1, 0, 0}));
  CHECK_EQ(dedup.gains, (FloatVec{12, 3, 16}));
  CHECK_EQ(dedup.id_counts, (IntVec{0, 1, 1, 1, 3, 3, 3, 3, 3}));

  g_test = "SortListOfCoo errors";
  sce::SortedCoo out;
  CHECK_ERROR(sce::SortListOfCoo(ViewsForSc(uv, 0), kChips, kScPerChip, 1, 256, "user_video", &out),
              "max ids per sparse core");
  CHECK_ERROR(sce::SortListOfCoo(ViewsForSc(uv, 0), kChips, kScPerChip, 256, 1, "user_video", &out),
              "unique ids");
  CHECK_ERROR(sce::SortListOfCoo(ViewsForSc(uv, 0), 3, kScPerChip, 256, 256, "user_video", &out),
              "power of two");
  const IntVec neg_cols = {3, -1, 8};
  views[0].cols = neg_cols.data();
  CHECK_ERROR(sce::SortListOfCoo(views, kChips, kScPerChip, 256, 256, "t", &out), "negative");
}

void TestPackCsrFromSortedLists() {
  g_test = "PackCsrFromSortedLists docs/preprocessing.md#csr-wrapped-coo-buffers";
  UserVideo uv;
  CHECK(BuildUserVideo(&uv));
  if (uv.user.size() != 4 || uv.video.size() != 4) return;
  std::vector<sce::SortedCoo> sorted;
  CHECK(SortAll(uv, &sorted));
  std::vector<sce::SortedIdsView> views;
  for (const sce::SortedCoo& s : sorted) {
    sce::SortedIdsView v;
    v.rows = s.rows.data();
    v.cols = s.cols.data();
    v.gains = s.gains.data();
    v.num_rows = v.num_cols = v.num_gains = static_cast<int64_t>(s.rows.size());
    v.id_counts = s.id_counts.data();
    v.num_id_counts = static_cast<int64_t>(s.id_counts.size());
    views.push_back(v);
  }
  sce::CsrParams params;
  params.num_replica = kChips;
  params.num_sc_per_chip = kScPerChip;
  params.max_minibatches_per_sc = 1;
  params.max_ids_buffer_size = 8 * 4 * 4;  // max_ids_per_chip_per_sample * B_stk_sc * S = 128
  params.table_name = "user_video";
  sce::CsrBufferSizes sizes;
  CHECK_OK(sce::GetCsrBufferSizes(params, &sizes));
  CHECK_EQ(sizes.row_pointers, int64_t{32});
  CHECK_EQ(sizes.ids, int64_t{128});
  IntVec row_pointers(sizes.row_pointers, -1), samples(sizes.ids, -1), tokens(sizes.ids, -1);
  FloatVec gains(sizes.ids, -1.0f);
  sce::CsrBuffers out = Bind(&row_pointers, &samples, &tokens, &gains);
  CHECK_OK(sce::PackCsrFromSortedLists(views, 0, params, &out));
  CHECK_EQ(Slice(row_pointers.data(), 0, 8), (IntVec{2, 9, 16, 16, 16, 16, 17, 26}));
  CHECK_EQ(Slice(row_pointers.data(), 8, 16), (IntVec{33, 40, 40, 40, 40, 40, 40, 41}));
  CHECK_EQ(Slice(row_pointers.data(), 16, 24), (IntVec{48, 49, 56, 56, 57, 65, 72, 72}));
  CHECK_EQ(Slice(row_pointers.data(), 24, 32), (IntVec{74, 80, 80, 80, 81, 88, 88, 89}));
  CHECK_EQ(out.ids_unpadded_size, int64_t{96});
  CHECK_EQ(out.row_pointers_unpadded_size, int64_t{32});
  CHECK_EQ(out.num_minibatches, int64_t{1});
  CHECK_EQ(out.num_dropped_ids, int64_t{0});
  const IntVec P6(6, PAD), P7(7, PAD);
  auto cat = [](IntVec a, const IntVec& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  CHECK_EQ(Slice(samples.data(), 0, 8), cat({0, 1}, P6));
  CHECK_EQ(Slice(tokens.data(), 0, 8), cat({0, 4}, P6));
  CHECK_EQ(Slice(samples.data(), 8, 16), cat({1}, P7));
  CHECK_EQ(Slice(tokens.data(), 8, 16), cat({0}, P7));
  CHECK_EQ(Slice(samples.data(), 16, 24), cat({3}, P7));
  CHECK_EQ(Slice(tokens.data(), 16, 24), cat({9}, P7));
  CHECK_EQ(Slice(samples.data(), 24, 32), cat({2, 3}, P6));
  CHECK_EQ(Slice(tokens.data(), 24, 32), cat({8, 8}, P6));
  // Valid gains are 1 and padding gains are float(PAD) = 2147483648.0.
  int valid = 0, bad_gain = 0;
  for (int64_t i = 0; i < out.ids_unpadded_size; ++i) {
    if (tokens[i] == PAD) {
      bad_gain += !(samples[i] == PAD && gains[i] == FPAD);
    } else {
      ++valid;
      bad_gain += gains[i] != 1.0f;
    }
  }
  CHECK_EQ(valid, 15);
  CHECK_EQ(bad_gain, 0);
  CHECK_EQ(FPAD, 2147483648.0f);

  g_test = "PackCsrFromSortedLists docs/preprocessing.md#csr-wrapped-coo-buffers dry run + exact-size buffers";
  sce::CsrBuffers dry_run;  // null buffers: only the sizes are computed
  CHECK_OK(sce::PackCsrFromSortedLists(views, 0, params, &dry_run));
  CHECK_EQ(dry_run.ids_unpadded_size, int64_t{96});
  CHECK_EQ(dry_run.row_pointers_unpadded_size, int64_t{32});
  CHECK_EQ(dry_run.num_minibatches, int64_t{1});
  IntVec rp_exact(dry_run.row_pointers_unpadded_size, -1);
  IntVec samples_exact(dry_run.ids_unpadded_size, -1), tokens_exact(dry_run.ids_unpadded_size, -1);
  FloatVec gains_exact(dry_run.ids_unpadded_size, -1.0f);
  sce::CsrBuffers exact = Bind(&rp_exact, &samples_exact, &tokens_exact, &gains_exact);
  CHECK_OK(sce::PackCsrFromSortedLists(views, 0, params, &exact));
  CHECK_EQ(rp_exact, Slice(row_pointers.data(), 0, 32));
  CHECK_EQ(samples_exact, Slice(samples.data(), 0, 96));
  CHECK_EQ(tokens_exact, Slice(tokens.data(), 0, 96));
  CHECK(gains_exact == FloatVec(gains.begin(), gains.begin() + 96));
  // The full-size buffers are PAD past the unpadded sizes.
  CHECK_EQ(Slice(tokens.data(), 96, 128), IntVec(32, PAD));

  g_test = "PackCsrFromSortedLists docs/preprocessing.md#csr-wrapped-coo-buffers overflow";
  params.max_ids_buffer_size = 64;
  CHECK_ERROR(sce::PackCsrFromSortedLists(views, 0, params, &out), "allow_id_dropping");
  params.allow_id_dropping = true;
  CHECK_OK(sce::PackCsrFromSortedLists(views, 0, params, &out));
  // SC2 keeps its replicas 1 and 4 (ending at 57 -> 64) and drops replica 5; SC3 drops all 4.
  CHECK_EQ(out.ids_unpadded_size, int64_t{64});
  CHECK_EQ(out.num_dropped_ids, int64_t{5});
  CHECK_EQ(Slice(row_pointers.data(), 16, 24), (IntVec{48, 49, 56, 56, 57, 64, 64, 64}));
  CHECK_EQ(Slice(row_pointers.data(), 24, 32), Block({64}));

  g_test = "PackCsrFromSortedLists errors";
  params.allow_id_dropping = false;
  params.max_ids_buffer_size = 100;
  CHECK_ERROR(sce::PackCsrFromSortedLists(views, 0, params, &out), "multiple of 8");
  params.max_ids_buffer_size = 128;
  std::vector<sce::SortedIdsView> three(views.begin(), views.begin() + 3);
  CHECK_ERROR(sce::PackCsrFromSortedLists(three, 0, params, &out), "one list entry per sparse core");
}

// ------------------------------------------------------------------------------------------------
// docs/preprocessing.md#minibatching GetMinibatchSplitsWithPhysicalReplica and docs/preprocessing.md#csr-buffers-with-minibatches GetMinibatchesInCsrWithPhysicalReplica
// ------------------------------------------------------------------------------------------------

void TestSplitEncoding() {
  g_test = "split encoding docs/preprocessing.md#split-encoding";
  CHECK_EQ(sce::BinaryToBucketSplits(1 << 0, 6), (IntVec{32}));
  CHECK_EQ(sce::BinaryToBucketSplits(1 << 1, 6), (IntVec{16}));
  CHECK_EQ(sce::BinaryToBucketSplits(1 << 2, 6), (IntVec{48}));
  CHECK_EQ(sce::BinaryToBucketSplits(1 << 3, 6), (IntVec{8}));
  CHECK_EQ(sce::BinaryToBucketSplits(13, 6), (IntVec{8, 32, 48}));
  CHECK_EQ(sce::BinaryToBucketSplits(0, 6), IntVec{});
  CHECK_EQ(sce::BucketSplitsToBinary({32}, 6), int64_t{1});
  CHECK_EQ(sce::BucketSplitsToBinary({16}, 6), int64_t{2});
  CHECK_EQ(sce::BucketSplitsToBinary({48}, 6), int64_t{4});
  CHECK_EQ(sce::BucketSplitsToBinary({8}, 6), int64_t{8});
  CHECK_EQ(sce::BucketSplitsToBinary({8, 32, 48}, 6), int64_t{13});
  CHECK_EQ(sce::BucketSplitsToBinary({}, 6), int64_t{0});
  // Round trip over every single split point and over every bit mask of a smaller tree.
  int bad = 0;
  for (int32_t x = 1; x < 64; ++x) {
    bad += sce::BinaryToBucketSplits(sce::BucketSplitsToBinary({x}, 6), 6) != IntVec{x};
  }
  for (int64_t bits = 0; bits < (1 << 7); ++bits) {  // L = 3: 7 bits, points in (0, 8)
    bad += sce::BucketSplitsToBinary(sce::BinaryToBucketSplits(bits, 3), 3) != bits;
  }
  CHECK_EQ(bad, 0);
}

const IntVec kRows9 = {0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 4, 7};
const IntVec kCols9 = {0, 8, 40, 44, 48, 44, 5, 2, 6, 10, 3, 63};
const FloatVec kGains9 = {1, 1, 1, 1, 1, 0.5f, 1, 1, 1, 1, 1, 1};

// Minibatch-splits parameters of the tests: one limit for ids and for unique ids per partition,
// one replica and the default division level unless the caller changes them.
sce::MinibatchSplitsParams SplitsParams(const std::string& table, int64_t sample_count,
                                        int64_t num_sc, int64_t vocab, int64_t limit) {
  sce::MinibatchSplitsParams p;
  p.table_name = table;
  p.sample_count = sample_count;
  p.num_sc_per_chip = num_sc;
  p.table_vocab_size = vocab;
  p.max_ids_per_partition = p.max_unique_ids_per_partition = limit;
  return p;
}

sce::MinibatchSplitsParams Params9() {
  sce::MinibatchSplitsParams p = SplitsParams("t", 8, 4, 64, 2);
  p.max_division_level = 6;
  return p;
}

void TestGetMinibatchSplits() {
  g_test = "GetMinibatchSplits docs/preprocessing.md#minibatch-split-search";
  sce::MinibatchSplits out;
  CHECK_OK(sce::GetMinibatchSplits(kRows9.data(), kCols9.data(), kGains9.data(), 12, 12, 12,
                                   Params9(), &out));
  CHECK_EQ(out.splits, int64_t{13});
  CHECK_EQ(sce::BinaryToBucketSplits(out.splits, 6), (IntVec{8, 32, 48}));
  CHECK_EQ(out.max_ids, int64_t{5});
  CHECK_EQ(out.max_uniques, int64_t{5});
  CHECK_EQ(out.rows, (IntVec{0, 0, 0, 1, 1, 1, 0, 0, 1, 0, 1}));
  CHECK_EQ(out.cols, (IntVec{0, 2, 10, 11, 12, 1, 0, 1, 2, 0, 15}));
  CHECK_EQ(out.gains, (FloatVec{1, 1, 1, 1.5f, 1, 1, 1, 1, 1, 1, 1}));
  CHECK_EQ(out.id_counts.size(), size_t{4 * 4 * 64 + 1});
  std::vector<IntVec> steps;  // (index, value) where id_counts changes
  for (size_t i = 1; i < out.id_counts.size(); ++i) {
    if (out.id_counts[i] != out.id_counts[i - 1]) {
      steps.push_back({static_cast<int32_t>(i), out.id_counts[i]});
    }
  }
  const std::vector<IntVec> want = {{1, 1},   {9, 2},   {41, 3},  {45, 4},  {49, 5},   {70, 6},
                                    {387, 7}, {391, 8}, {395, 9}, {708, 10}, {1024, 11}};
  CHECK_EQ(steps.size(), want.size());
  CHECK(steps == want);
  if (steps != want) {
    for (const IntVec& s : steps) std::fprintf(stderr, "    step %d:%d\n", s[0], s[1]);
  }
  if (!out.id_counts.empty()) CHECK_EQ(out.id_counts[0], 0);

  g_test = "GetMinibatchSplits writes the ids into the buffers its allocator gives";
  IntVec given_rows, given_cols;
  FloatVec given_gains;
  int64_t asked = -1;
  sce::MinibatchSplits in_place;
  CHECK_OK(sce::GetMinibatchSplits(
      kRows9.data(), kCols9.data(), kGains9.data(), 12, 12, 12, Params9(), &in_place,
      sce::RunSerially, [&](int64_t total, sce::SplitIdBuffers* buffers) {
        asked = total;
        given_rows.assign(total, -1);
        given_cols.assign(total, -1);
        given_gains.assign(total, -1.0f);
        *buffers = {given_rows.data(), given_cols.data(), given_gains.data()};
        return sce::Status::Ok();
      }));
  CHECK_EQ(asked, int64_t{11});
  CHECK_EQ(given_rows, out.rows);
  CHECK_EQ(given_cols, out.cols);
  CHECK_EQ(given_gains, out.gains);
  CHECK(in_place.rows.empty());
  CHECK(in_place.id_counts == out.id_counts);
  CHECK_EQ(in_place.splits, out.splits);
  CHECK_ERROR(sce::GetMinibatchSplits(kRows9.data(), kCols9.data(), kGains9.data(), 12, 12, 12,
                                      Params9(), &in_place, sce::RunSerially,
                                      [](int64_t, sce::SplitIdBuffers*) {
                                        return sce::FailedPrecondition("no memory left");
                                      }),
              "no memory left");

  g_test = "GetMinibatchSplits reports the first bad id however its chunks are scheduled";
  {
    // 3 validation chunks of 2^16 ids; a descent at the first chunk boundary and a bad id in the
    // last chunk. Chunks run last-first, yet the error names the first bad position.
    const int64_t n = 3 << 16;
    IntVec rows(n), cols(n, 1);
    FloatVec gains(n, 1.0f);
    for (int64_t i = 0; i < n; ++i) rows[i] = static_cast<int32_t>(i / 64);
    rows[1 << 16] = 0;
    cols[n - 1] = -5;
    sce::MinibatchSplitsParams big = Params9();
    big.sample_count = 4096;
    big.max_ids_per_partition = big.max_unique_ids_per_partition = 1 << 30;
    const sce::ParallelFor last_first = [](int64_t count, int64_t, const sce::RangeFn& work) {
      for (int64_t c = count - 1; c >= 0; --c) work(c, c + 1);
    };
    sce::MinibatchSplits ignored;
    CHECK_ERROR(sce::GetMinibatchSplits(rows.data(), cols.data(), gains.data(), n, n, n, big,
                                        &ignored, last_first),
                "got 0 at position 65536 after 1023");
    rows[1 << 16] = 1024;
    CHECK_ERROR(sce::GetMinibatchSplits(rows.data(), cols.data(), gains.data(), n, n, n, big,
                                        &ignored, last_first),
                "id -5 at position 196607");
  }

  g_test = "GetMinibatchSplits errors";
  const IntVec unsorted = {0, 0, 0, 1, 1, 1, 0, 2, 2, 3, 4, 7};
  CHECK_ERROR(sce::GetMinibatchSplits(unsorted.data(), kCols9.data(), kGains9.data(), 12, 12, 12,
                                      Params9(), &out),
              "sorted");
  const IntVec negative = {0, 8, 40, 44, 48, 44, 5, 2, -6, 10, 3, 63};
  CHECK_ERROR(sce::GetMinibatchSplits(kRows9.data(), negative.data(), kGains9.data(), 12, 12, 12,
                                      Params9(), &out),
              "out of range");
  sce::MinibatchSplitsParams coarse = Params9();
  coarse.max_division_level = 0;  // one division: 5 ids of replica 0 on SC0 cannot fit in 2
  CHECK_ERROR(sce::GetMinibatchSplits(kRows9.data(), kCols9.data(), kGains9.data(), 12, 12, 12,
                                      coarse, &out),
              "too many ids");
  sce::MinibatchSplitsParams odd = Params9();
  odd.sample_count = 6;
  CHECK_ERROR(sce::GetMinibatchSplits(kRows9.data(), kCols9.data(), kGains9.data(), 12, 12, 12,
                                      odd, &out),
              "multiple");
}

// The minibatch splits' ids and counts against the obvious computation: per SparseCore, a
// std::stable_sort by (shard, row inside the shard), duplicates (row, col) merged, and the kept ids
// counted per (SparseCore, shard, division). Divisions are col ranges, so the order is the same at
// any division level. Large vocabularies and batches do not fit (key, row, position) in one sort
// word, so DedupAndCountSc reads their rows by position and takes the scalar loop; the others take
// the AVX-512 loop where the CPU has it. The gains are not exact in binary, so a merge that added
// them in another order would show. (The split masks under small limits are compared with the
// numpy reference in tests/ops/test_property_preprocessing.py.)
void CheckSplitIdsAgainstStableSort(int64_t vocab, int64_t per_sc, int64_t ids_per_sc,
                                    uint32_t seed, int division_level = 0) {
  std::mt19937 rng(seed);
  const int64_t S = 4, n = S * ids_per_sc;
  IntVec rows(n), cols(n);
  FloatVec gains(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t sc = i / ids_per_sc;
    rows[i] = static_cast<int32_t>(sc * per_sc + (per_sc * (i % ids_per_sc)) / ids_per_sc);
    // A few repeated ids, so duplicates (same row and col) occur.
    cols[i] = rng() % 8 == 0 ? 7 : static_cast<int32_t>(rng() % vocab);
    gains[i] = static_cast<float>(rng() % 1000) / 7.0f - 40.0f;
  }
  sce::MinibatchSplitsParams p = SplitsParams("t", S * per_sc, S, vocab, 1 << 30);
  p.max_division_level = division_level;
  const int64_t D = int64_t{1} << division_level;
  const int64_t division_size = (vocab + D - 1) / D;
  sce::MinibatchSplits out;
  CHECK_OK(sce::GetMinibatchSplits(rows.data(), cols.data(), gains.data(), n, n, n, p, &out));
  IntVec want_rows, want_cols;
  FloatVec want_gains;
  std::vector<int64_t> kept_per_slot(S * S * D, 0), uniques_per_pair(S * S, 0);
  for (int64_t sc = 0; sc < S; ++sc) {
    std::vector<int64_t> order(ids_per_sc);
    std::iota(order.begin(), order.end(), sc * ids_per_sc);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return std::make_pair(cols[a] % S, cols[a] / S) < std::make_pair(cols[b] % S, cols[b] / S);
    });
    for (size_t k = 0; k < order.size(); ++k) {
      const int64_t i = order[k];
      if (k > 0 && rows[i] == rows[order[k - 1]] && cols[i] == cols[order[k - 1]]) {
        want_gains.back() += gains[i];
        continue;
      }
      const int64_t shard = cols[i] % S;
      ++kept_per_slot[(sc * S + shard) * D + std::min<int64_t>(cols[i] / division_size, D - 1)];
      if (k == 0 || cols[i] != cols[order[k - 1]]) ++uniques_per_pair[sc * S + shard];
      want_rows.push_back(static_cast<int32_t>(rows[i] - sc * per_sc));
      want_cols.push_back(cols[i] / S);
      want_gains.push_back(gains[i]);
    }
  }
  CHECK(out.rows == want_rows);
  CHECK(out.cols == want_cols);
  CHECK(out.gains.size() == want_gains.size() &&
        (want_gains.empty() || std::memcmp(out.gains.data(), want_gains.data(),
                                           sizeof(float) * want_gains.size()) == 0));
  std::vector<int32_t> want_counts(1, 0);
  int64_t max_ids = 0;
  for (int64_t pair = 0; pair < S * S; ++pair) {
    int64_t pair_ids = 0;
    for (int64_t d = 0; d < D; ++d) {
      pair_ids += kept_per_slot[pair * D + d];
      want_counts.push_back(want_counts.back() +
                            static_cast<int32_t>(kept_per_slot[pair * D + d]));
    }
    max_ids = std::max(max_ids, pair_ids);
  }
  CHECK(out.id_counts == want_counts);
  CHECK_EQ(out.max_ids, max_ids);
  CHECK_EQ(out.max_uniques,
           *std::max_element(uniques_per_pair.begin(), uniques_per_pair.end()));
}

void TestSplitIdsMatchStableSort() {
  g_test = "GetMinibatchSplits: ids sorted and merged as a plain stable sort does";
  for (uint32_t seed = 0; seed < 3; ++seed) {
    CheckSplitIdsAgainstStableSort(1000, 64, 300, seed);              // words with rows
    CheckSplitIdsAgainstStableSort(1000, 16, 3000, seed, 3);          // long runs, 8 divisions
    CheckSplitIdsAgainstStableSort(100000, 4096, 40000, seed, 2);     // the benchmark's scale
    CheckSplitIdsAgainstStableSort(2000000000, 1 << 20, 20000, seed);  // 31 + 20 + 15 bits > 64
    CheckSplitIdsAgainstStableSort(50, 8, 40, seed);                   // short: std::stable_sort
  }
}

void TestPackCsrFromMinibatchSplits() {
  g_test = "PackCsrFromMinibatchSplits docs/preprocessing.md#csr-buffers-with-minibatches";
  sce::MinibatchSplits mb;
  CHECK_OK(sce::GetMinibatchSplits(kRows9.data(), kCols9.data(), kGains9.data(), 12, 12, 12,
                                   Params9(), &mb));
  if (mb.id_counts.size() != 4 * 4 * 64 + 1) return;
  sce::SortedIdsView view;
  view.rows = mb.rows.data();
  view.cols = mb.cols.data();
  view.gains = mb.gains.data();
  view.num_rows = view.num_cols = view.num_gains = static_cast<int64_t>(mb.rows.size());
  view.id_counts = mb.id_counts.data();
  view.num_id_counts = static_cast<int64_t>(mb.id_counts.size());
  sce::CsrParams params;
  params.num_replica = 1;
  params.num_sc_per_chip = 4;
  params.max_minibatches_per_sc = 8;
  params.max_ids_buffer_size = 16 * 8;  // max_ids_per_chip_per_sample * sample_count = 128
  params.max_division_level = 6;
  params.table_name = "t";
  sce::CsrBufferSizes sizes;
  CHECK_OK(sce::GetCsrBufferSizes(params, &sizes));
  CHECK_EQ(sizes.row_pointers, int64_t{8 * 4 * 8});
  IntVec row_pointers(sizes.row_pointers, -1), samples(sizes.ids, -1), tokens(sizes.ids, -1);
  FloatVec gains(sizes.ids, -1.0f);
  sce::CsrBuffers out = Bind(&row_pointers, &samples, &tokens, &gains);
  CHECK_OK(sce::PackCsrFromMinibatchSplits(view, mb.splits, params, &out));
  CHECK_EQ(out.num_minibatches, int64_t{4});
  CHECK_EQ(out.row_pointers_unpadded_size, int64_t{128});
  CHECK_EQ(out.ids_unpadded_size, int64_t{72});
  auto block = [&](int sc, int minibatch) {
    const int64_t k = (sc * out.num_minibatches + minibatch) * 8;
    return Slice(row_pointers.data(), k, k + 8);
  };
  CHECK_EQ(block(0, 0), (IntVec{1, 9, 16, 16, 16, 16, 16, 16}));
  CHECK_EQ(block(0, 1), Block({17, 24}));
  CHECK_EQ(block(0, 2), Block({26, 32}));
  CHECK_EQ(block(0, 3), Block({33, 40}));
  CHECK_EQ(block(1, 0), Block({40, 40, 42, 48}));
  CHECK_EQ(block(1, 1), Block({48, 48, 49, 56}));
  CHECK_EQ(block(2, 0), Block({56, 56, 56, 57, 64}));
  CHECK_EQ(block(3, 3), Block({64, 64, 64, 65, 72}));
  // Non-pad slots: slot -> (token, sample, gain); every other slot below 72 is PAD.
  const std::vector<std::vector<double>> want = {
      {0, 0, 0, 1},   {8, 1, 1, 1},    {16, 2, 0, 1},   {24, 10, 0, 1},
      {25, 11, 1, 1.5}, {32, 12, 1, 1}, {40, 0, 0, 1},   {41, 1, 0, 1},
      {48, 2, 1, 1},  {56, 0, 0, 1},   {64, 15, 1, 1}};
  std::vector<std::vector<double>> got;
  int bad_pad = 0;
  for (int64_t i = 0; i < out.ids_unpadded_size; ++i) {
    if (tokens[i] != PAD) {
      got.push_back({static_cast<double>(i), static_cast<double>(tokens[i]),
                     static_cast<double>(samples[i]), gains[i]});
    } else {
      bad_pad += !(samples[i] == PAD && gains[i] == FPAD);
    }
  }
  CHECK(got == want);
  if (got != want) {
    for (const auto& g : got) std::fprintf(stderr, "    slot %g: %g %g %g\n", g[0], g[1], g[2], g[3]);
  }
  CHECK_EQ(bad_pad, 0);

  g_test = "PackCsrFromMinibatchSplits errors";
  params.max_minibatches_per_sc = 3;
  CHECK_ERROR(sce::PackCsrFromMinibatchSplits(view, mb.splits, params, &out), "minibatches");
  params.max_minibatches_per_sc = 8;
  params.max_ids_buffer_size = 64;
  CHECK_ERROR(sce::PackCsrFromMinibatchSplits(view, mb.splits, params, &out), "allow_id_dropping");
  params.max_ids_buffer_size = 128;
  view.num_id_counts = 257;
  CHECK_ERROR(sce::PackCsrFromMinibatchSplits(view, mb.splits, params, &out), "id_counts");
}

// ------------------------------------------------------------------------------------------------
// docs/layout.md#stacking layout stacker
// ------------------------------------------------------------------------------------------------

void TestLayoutStacker() {
  g_test = "LayoutStacker docs/layout.md#stacking";
  sce::LayoutStacker stacker(/*num_partitions=*/2, /*sparse_cores_per_partition=*/4,
                             /*disable_table_stacking=*/false);
  // Python adds tables in name order; only the first table gets samples (the 2.21 bug).
  CHECK_OK(stacker.AddTable("b", 100, 16, "g1", 8, 1));
  CHECK_OK(stacker.AddTable("a", 33, 10, "g1", 0, 0));
  CHECK_OK(stacker.AddTable("d", 50, 12, "g0", 0, 0));
  CHECK_OK(stacker.AddTable("c", 70, 13, "g1", 0, 0));
  CHECK_OK(stacker.AddTable("e", 64, 16, "g1", 0, 0));
  const std::vector<sce::TableLayout> layouts = stacker.GetLayouts();
  CHECK_EQ(layouts.size(), size_t{5});
  if (layouts.size() != 5) return;
  std::vector<std::string> names;
  for (const sce::TableLayout& t : layouts) names.push_back(t.table_name);
  CHECK_EQ(names, (std::vector<std::string>{"d", "b", "a", "c", "e"}));
  const sce::TableLayout& d = layouts[0];
  CHECK_EQ(d.stacked_table_name, std::string("d"));
  CHECK_EQ(d.padded_width, int64_t{16});
  CHECK_EQ(d.padded_height, int64_t{64});
  CHECK_EQ(d.sparse_core_shard_row_offset, int64_t{0});
  CHECK_EQ(d.sparse_core_shard_rotation, int64_t{0});
  CHECK_EQ(d.total_rows_per_sparse_core_shard, int64_t{8});
  const int64_t padded_rows[] = {128, 64, 128, 64};
  const int64_t row_offsets[] = {0, 16, 24, 40};
  const int64_t rotations[] = {0, 4, 0, 4};
  for (int i = 0; i < 4; ++i) {
    const sce::TableLayout& t = layouts[i + 1];
    CHECK_EQ(t.stacked_table_name, std::string("b_a_c_e"));
    CHECK_EQ(t.padded_height, padded_rows[i]);
    CHECK_EQ(t.padded_width, int64_t{16});
    CHECK_EQ(t.sparse_core_shard_row_offset, row_offsets[i]);
    CHECK_EQ(t.sparse_core_shard_rotation, rotations[i]);
    CHECK_EQ(t.total_rows_per_sparse_core_shard, int64_t{48});
    CHECK_EQ(t.num_sparse_cores, int64_t{8});
    CHECK_EQ(t.num_partitions, int64_t{2});
  }
  CHECK_EQ(layouts[1].per_sparse_core_batch_size, int64_t{2});
  CHECK_EQ(layouts[1].num_features, int64_t{1});

  g_test = "LayoutStacker docs/layout.md#rounding-rows-and-columns limits and disabled stacking";
  sce::LayoutStacker unstacked(2, 4, /*disable_table_stacking=*/true);
  CHECK_OK(unstacked.AddTable("x", 100, 16, "g", 0, 0));
  CHECK_OK(unstacked.AddTable("y", 100, 16, "g", 0, 0));
  const std::vector<sce::TableLayout> separate = unstacked.GetLayouts();
  CHECK_EQ(separate.size(), size_t{2});
  if (separate.size() == 2) {
    CHECK_EQ(separate[1].stacked_table_name, std::string("y"));
    CHECK_EQ(separate[1].sparse_core_shard_row_offset, int64_t{0});
  }
  // A sum equal to the activation limit is rejected: 4 * 16 * 8 = 512 bytes per table.
  sce::StackerLimits limits;
  limits.activation_mem_bytes = 1024;
  sce::LayoutStacker limited(2, 4, false, limits);
  CHECK_OK(limited.AddTable("p", 8, 16, "g", 32, 1));
  CHECK_OK(limited.AddTable("q", 8, 16, "g", 32, 1));
  const std::vector<sce::TableLayout> split = limited.GetLayouts();
  CHECK_EQ(split.size(), size_t{2});
  if (split.size() == 2) CHECK_EQ(split[0].stacked_table_name, std::string("p"));

  g_test = "LayoutStacker errors";
  CHECK_ERROR(stacker.AddTable("b", 10, 16, "g1", 0, 0), "twice");
  CHECK_ERROR(stacker.AddTable("z", 0, 16, "g1", 0, 0), ">= 1");
}


// ---- Issue 10: checked arithmetic and the hardening of every entry point ----------------------

void TestCheckedMath() {
  g_test = "checked arithmetic";
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  int64_t out = 0;
  CHECK(sce::CheckedAdd(2, 3, &out) && out == 5);
  CHECK(!sce::CheckedAdd(kMax, 1, &out));
  CHECK(!sce::CheckedAdd(kMin, -1, &out));
  CHECK(sce::CheckedSub(-5, 3, &out) && out == -8);
  CHECK(!sce::CheckedSub(kMin, 1, &out));
  CHECK(sce::CheckedMul(int64_t{1} << 31, int64_t{1} << 31, &out) && out == int64_t{1} << 62);
  CHECK(!sce::CheckedMul(int64_t{1} << 32, int64_t{1} << 31, &out));
  CHECK(!sce::CheckedMul(kMin, -1, &out));
  CHECK(!sce::CheckedMul(int64_t{1} << 62, 4, &out));  // wraps to 0 unchecked
  CHECK(sce::CheckedRoundUp(0, 8, &out) && out == 0);
  CHECK(sce::CheckedRoundUp(9, 8, &out) && out == 16);
  CHECK(sce::CheckedRoundUp(16, 8, &out) && out == 16);
  CHECK(sce::CheckedRoundUp(kMax - 7, 8, &out) && out == kMax - 7);  // a multiple of 8
  CHECK(!sce::CheckedRoundUp(kMax, 8, &out));
  CHECK(!sce::CheckedRoundUp(kMax - 6, 32, &out));
  CHECK(!sce::CheckedRoundUp(5, 0, &out));
  CHECK(!sce::CheckedRoundUp(-1, 8, &out));
  CHECK(sce::CheckedProduct({}, &out) && out == 1);
  CHECK(sce::CheckedProduct({2, 3, 4}, &out) && out == 24);
  CHECK(!sce::CheckedProduct({int64_t{1} << 40, int64_t{1} << 40, 1}, &out));
  CHECK(!sce::CheckedProduct({-1, 2}, &out));
  CHECK_EQ(sce::SaturatingMul(int64_t{1} << 62, 4), kMax);
  CHECK_EQ(sce::SaturatingMul(3, 4), int64_t{12});
  CHECK_EQ(sce::SaturatingAdd(kMax, 5), kMax);
  CHECK_EQ(sce::SaturatingAdd(kMin, -5), kMin);
  CHECK_OK(sce::CheckInRange("table 't'", "num_replica", 4, 1, 8));
  CHECK_ERROR(sce::CheckInRange("table 't'", "num_replica", int64_t{1} << 40, 1, 8),
              "table 't': num_replica must be in [1, 8], got 1099511627776");
  CHECK_OK(sce::CheckedSize("table 't'", "a * b", {4, 8}, 32, &out));
  CHECK_EQ(out, int64_t{32});
  CHECK_ERROR(sce::CheckedSize("table 't'", "a * b", {4, 9}, 32, &out),
              "a * b (4 * 9) exceeds the limit of 32");
  CHECK_ERROR(sce::CheckedSize("table 't'", "a * b", {int64_t{1} << 62, 4}, kMax, &out),
              "exceeds the limit");
  g_test = "Log2 and IsPowerOfTwo at the extremes";
  CHECK_EQ(sce::Log2(1), 0);
  CHECK_EQ(sce::Log2(8), 3);
  CHECK_EQ(sce::Log2(int64_t{1} << 62), 62);
  CHECK(!sce::IsPowerOfTwo(0) && !sce::IsPowerOfTwo(kMin) && sce::IsPowerOfTwo(int64_t{1} << 62));
}

// Valid CSR buffers for S SparseCores x 1 replica (S shards), one entry per shard.
struct SmallCsr {
  IntVec row_pointers, samples, tokens;
  FloatVec gains;
  sce::CsrView View(int64_t S, int64_t input_size, int64_t table_rows) {
    row_pointers.clear();
    samples.clear();
    tokens.clear();
    gains.clear();
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t p = 0; p < sce::RoundUp(S, 8); ++p) {
        if (p < S) {
          samples.push_back(0);
          tokens.push_back(static_cast<int32_t>(p % 2));
          gains.push_back(1.0f);
          while (tokens.size() % 8) {
            samples.push_back(sce::kPad);
            tokens.push_back(sce::kPad);
            gains.push_back(static_cast<float>(sce::kPad));
          }
        }
        row_pointers.push_back(static_cast<int32_t>(tokens.size()));
      }
    }
    sce::CsrView v;
    v.row_pointers = row_pointers.data();
    v.num_row_pointers = static_cast<int64_t>(row_pointers.size());
    v.sample_ids = samples.data();
    v.token_ids = tokens.data();
    v.gains = gains.data();
    v.num_sample_ids = v.num_token_ids = v.num_gains = static_cast<int64_t>(tokens.size());
    v.num_sc_per_device = S;
    v.input_size = input_size;
    v.table_rows = table_rows;
    v.table_name = "t";
    return v;
  }
};

// One SparseCore and one shard: a single segment holding all n ids (n a multiple of 8, since the
// empty segments after it start 8-aligned). The ids are set by the caller.
struct OneSegmentCsr {
  IntVec row_pointers, samples, tokens;
  FloatVec gains;
  explicit OneSegmentCsr(int64_t n)
      : row_pointers(8, static_cast<int32_t>(n)), samples(n, PAD), tokens(n, PAD),
        gains(n, 1.0f) {}
  sce::CsrView View(int64_t input_size, int64_t table_rows) {
    sce::CsrView v;
    v.row_pointers = row_pointers.data();
    v.num_row_pointers = 8;
    v.sample_ids = samples.data();
    v.token_ids = tokens.data();
    v.gains = gains.data();
    v.num_sample_ids = v.num_token_ids = v.num_gains = static_cast<int64_t>(tokens.size());
    v.num_sc_per_device = 1;
    v.input_size = input_size;
    v.table_rows = table_rows;
    v.table_name = "t";
    return v;
  }
};

void TestCsrViewIds() {
  g_test = "ValidateCsrView checks every non-padding id, at any position of a long segment";
  // A shard of 5 rows and 7 samples.
  for (int64_t n : {8, 16, 64, 1000}) {
    OneSegmentCsr csr(n);
    IntVec& samples = csr.samples;
    IntVec& tokens = csr.tokens;
    for (int64_t i = 0; i < n; ++i) {
      samples[i] = static_cast<int32_t>(i % 7);
      tokens[i] = static_cast<int32_t>(i % 5);
    }
    const sce::CsrView v = csr.View(7, 5);
    CHECK_OK(sce::ValidateCsrView(v));
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      const int32_t token = tokens[at], sample = samples[at];
      for (int32_t bad : {5, -1, std::numeric_limits<int32_t>::min(), sce::kPad - 1}) {
        tokens[at] = bad;
        CHECK_ERROR(sce::ValidateCsrView(v), "table 't': token id " + std::to_string(bad) +
                                                 " at position " + std::to_string(at));
      }
      tokens[at] = token;
      for (int32_t bad : {7, -3, sce::kPad - 1}) {
        samples[at] = bad;
        CHECK_ERROR(sce::ValidateCsrView(v), "sample id " + std::to_string(bad) + " at position " +
                                                 std::to_string(at));
      }
      // A padding entry is skipped whatever its other id holds.
      samples[at] = sce::kPad;
      tokens[at] = -9;
      CHECK_OK(sce::ValidateCsrView(v));
      tokens[at] = sce::kPad;
      samples[at] = 1 << 30;
      CHECK_OK(sce::ValidateCsrView(v));
      tokens[at] = token;
      samples[at] = sample;
    }
    // Ids past the segment's end are not read as ids of the segment.
    if (n > 8) {
      csr.row_pointers.assign(8, 8);
      tokens[n - 1] = 99;
      CHECK_OK(sce::ValidateCsrView(v));
    }
  }
  // Limits at the int32 edge: a shard of 2^31 rows or more admits every non-negative token.
  OneSegmentCsr csr(8);
  csr.samples[0] = 0;
  csr.tokens[0] = std::numeric_limits<int32_t>::max() - 1;
  sce::CsrView v = csr.View(1, int64_t{1} << 32);
  CHECK_OK(sce::ValidateCsrView(v));
  v.table_rows = int64_t{1} << 31;
  CHECK_OK(sce::ValidateCsrView(v));
  v.table_rows = (int64_t{1} << 31) - 2;
  CHECK_ERROR(sce::ValidateCsrView(v), "token id 2147483646 at position 0 is out of range for "
                                       "a shard of 2147483646 rows");
}

void TestCsrViewBounds() {
  g_test = "ValidateCsrView rejects huge attributes before reading";
  SmallCsr csr;
  sce::CsrView good = csr.View(2, 4, 8);
  CHECK_OK(sce::ValidateCsrView(good));
  sce::CsrView v = good;
  v.num_sc_per_device = int64_t{1} << 62;  // a power of two whose products wrap around
  CHECK_ERROR(sce::ValidateCsrView(v), "num_sparsecores_per_device must be a power of two in");
  v = good;
  v.num_sc_per_device = int64_t{1} << 32;
  CHECK_ERROR(sce::ValidateCsrView(v), "got 4294967296");
  v = good;
  v.num_replica = int64_t{1} << 40;
  CHECK_ERROR(sce::ValidateCsrView(v), "num_replica must be in [1, 65536]");
  v = good;
  v.num_source_replicas = int64_t{1} << 62;
  CHECK_ERROR(sce::ValidateCsrView(v), "num_source_replicas must be in");
  v = good;
  v.first_local_shard = std::numeric_limits<int64_t>::max();
  CHECK_ERROR(sce::ValidateCsrView(v), "local shards");
  v = good;
  v.num_local_shards = std::numeric_limits<int64_t>::max();
  CHECK_ERROR(sce::ValidateCsrView(v), "local shards");
  v = good;
  v.num_local_shards = -5;
  CHECK_ERROR(sce::ValidateCsrView(v), "local shards");
  v = good;
  v.input_size = int64_t{1} << 62;
  CHECK_ERROR(sce::ValidateCsrView(v), "input_size");
  v = good;
  v.num_minibatches = std::numeric_limits<int32_t>::max();
  CHECK_ERROR(sce::ValidateCsrView(v), "row_pointers has 16 entries per replica");
  // Empty buffers with null data pointers validate (no pointer arithmetic on null).
  sce::CsrView empty;
  empty.num_sc_per_device = 1;
  empty.table_name = "t";
  CHECK_ERROR(sce::ValidateCsrView(empty), "row_pointers has 0 entries");
  IntVec eight(8, 0);
  empty.row_pointers = eight.data();
  empty.num_row_pointers = 8;
  CHECK_OK(sce::ValidateCsrView(empty));
  sce::SparseDenseMatmul(empty, static_cast<const float*>(nullptr), 0, sce::Quantization(), nullptr, sce::RunSerially);

  g_test = "quantization bounds must be finite";
  sce::Quantization q;
  q.low = -INFINITY;
  q.high = INFINITY;
  q.num_buckets = 4;
  CHECK_ERROR(sce::ValidateQuantization(q, "t"), "finite low < high");
  q.low = -3e38f;
  q.high = 3e38f;
  CHECK_ERROR(sce::ValidateQuantization(q, "t"), "finite low < high");
}

void TestNonFiniteGradients() {
  g_test = "non-finite gradients: detection, error data and skip";
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  FloatVec finite = {1.0f, -2.0f, 3e38f, -3e38f, 0.0f, -0.0f, 1e-45f};
  CHECK(sce::AllFinite(finite.data(), static_cast<int64_t>(finite.size())));
  CHECK(sce::AllFinite(nullptr, 0));
  for (float bad : {nan, inf, -inf}) {
    for (size_t at = 0; at < finite.size(); ++at) {
      FloatVec x = finite;
      x[at] = bad;
      CHECK(!sce::AllFinite(x.data(), static_cast<int64_t>(x.size())));
    }
  }
  // 2 SparseCores, 2 shards of 2 rows, 2 samples per SC, dim 2. Entry of SC s, shard p: sample 0,
  // token p % 2 -> activation rows 0 (SC 0) and 2 (SC 1); table rows 0 (shard 0) and 3 (shard 1).
  SmallCsr csr;
  const sce::CsrView v = csr.View(2, 4, 4);
  CHECK_OK(sce::ValidateCsrView(v));
  FloatVec grads = {1, 1, 5, 5, nan, 2, 7, 7};  // activation row 2 (SC 1, sample 0) is bad
  std::vector<uint8_t> bad;
  sce::NonFiniteContribution first;
  sce::FindNonFiniteContributions(v, sce::GradientRows::InCsrOrder(v, grads.data(), 2), 2, &bad,
                                  &first);
  CHECK_EQ(Str(std::vector<int>(bad.begin(), bad.end())), std::string("[0,0,1,0]"));
  CHECK(first.found);
  CHECK_EQ(first.activation_row, int64_t{2});
  CHECK_EQ(first.shard, int64_t{0});
  CHECK_EQ(first.table_row, int64_t{0});
  CHECK(!first.bad_gain);

  FloatVec table = {1, 1, 2, 2, 3, 3, 4, 4};
  const FloatVec table_before = table;
  const float no_hypers[1] = {0.0f};
  const int64_t skipped = sce::FusedUpdate<sce::SgdOptimizer>(
      v, sce::GradientRows::InCsrOrder(v, grads.data(), 2), 2, 0.5f, no_hypers, sce::Clip(),
      table.data(), {}, sce::RunSerially, bad.data());
  // Row 0 (shard 0) gets SC 0 row 0 (finite) and SC 1 row 2 (NaN): skipped. Row 3 (shard 1,
  // token 1) gets rows 0 and 2 as well: skipped. Rows 1 and 2 are untouched.
  CHECK_EQ(skipped, int64_t{2});
  CHECK_EQ(Str(table), Str(table_before));

  // Only unreferenced rows are bad: nothing is found and the normal update runs.
  FloatVec grads2 = {1, 1, nan, 5, 2, 2, inf, 7};  // rows 1 and 3 (sample 1) are not referenced
  sce::FindNonFiniteContributions(v, sce::GradientRows::InCsrOrder(v, grads2.data(), 2), 2, &bad,
                                  &first);
  CHECK(!first.found);
  const int64_t none = sce::FusedUpdate<sce::SgdOptimizer>(
      v, sce::GradientRows::InCsrOrder(v, grads2.data(), 2), 2, 0.5f, no_hypers, sce::Clip(),
      table.data(), {}, sce::RunSerially);
  CHECK_EQ(none, int64_t{0});
  // Row 0 (shard 0, token 0) gets rows 0 and 2: 1 - 0.5 * (1 + 2) = -0.5.
  CHECK_EQ(table[0], -0.5f);

  // A non-finite gain is reported as such.
  SmallCsr csr2;
  sce::CsrView v2 = csr2.View(2, 4, 4);
  csr2.gains[0] = inf;
  FloatVec clean(8, 1.0f);
  sce::FindNonFiniteContributions(v2, sce::GradientRows::InCsrOrder(v2, clean.data(), 2), 2, &bad,
                                  &first);
  CHECK(first.found && first.bad_gain && first.position == 0);

  sce::NonFiniteGradients mode;
  CHECK_OK(sce::ParseNonFiniteGradients("skip", &mode));
  CHECK(mode == sce::NonFiniteGradients::kSkip);
  CHECK_ERROR(sce::ParseNonFiniteGradients("ignore", &mode), "must be 'error' or 'skip'");
}

void TestPreprocessingBounds() {
  g_test = "COO with a huge sample_count allocates nothing per sample";
  IntVec index = {0, 0, 5, 0, 5, 0}, values = {3, 4, 4};
  FloatVec weights = {1.0f, 2.0f, 6.0f};
  sce::IdInput in;
  in.index_data = index.data();
  in.index_rank = 2;
  in.index_dim0 = 3;
  in.index_dim1 = 2;
  in.values = values.data();
  in.num_values = 3;
  in.weights = weights.data();
  in.weights_rank = 1;
  in.num_weights = 3;
  sce::CooEntries out;
  CHECK_OK(sce::ConvertToCoo(in, std::numeric_limits<int32_t>::max(), sce::Combiner::kMean, -1,
                             {"t", "f"}, &out));
  CHECK_EQ(Str(out.rows), std::string("[0,5]"));
  CHECK_EQ(Str(out.cols), std::string("[3,4]"));
  CHECK_NEAR(out.gains, {1.0, 1.0});  // row 0: 1 / 1; row 5: (2 + 6) / 8

  g_test = "stacking transform bounds (no truncated or shifted ids)";
  IntVec splits = {0, 1, 2, 3, 4};
  IntVec ids = {1, 2, 3, 7};
  FloatVec one = {1.0f};
  sce::IdInput ragged;
  ragged.index_data = splits.data();
  ragged.index_dim0 = 5;
  ragged.values = ids.data();
  ragged.num_values = 4;
  ragged.weights = one.data();
  ragged.weights_rank = 0;
  ragged.num_weights = 1;
  sce::StackingTransform t;
  t.num_sc_per_chip = 2;
  t.num_sc_shards = 4;
  t.stacked_table_sample_count = 4;
  std::vector<sce::CooEntries> per_sc;
  CHECK_OK(sce::ConvertToListOfCoo(ragged, 4, sce::Combiner::kSum, t, -1, {"t", "f"}, &per_sc));
  sce::StackingTransform bad = t;
  bad.row_offset = int64_t{1} << 33;
  bad.stacked_table_sample_count = int64_t{1} << 34;
  CHECK_ERROR(sce::ConvertToListOfCoo(ragged, 4, sce::Combiner::kSum, bad, -1, {"t", "f"}, &per_sc),
              "table 't', feature 'f': stacked_table_sample_count must be in [0, 2147483647]");
  bad = t;
  bad.col_offset = std::numeric_limits<int64_t>::max();
  CHECK_ERROR(sce::ConvertToListOfCoo(ragged, 4, sce::Combiner::kSum, bad, -1, {"t", "f"}, &per_sc),
              "col_offset must be in [0, 2147483647]");
  bad = t;
  bad.col_offset = std::numeric_limits<int32_t>::max() - 2;  // fits, but id 7 maps past int32
  CHECK_ERROR(sce::ConvertToListOfCoo(ragged, 4, sce::Combiner::kSum, bad, -1, {"t", "f"}, &per_sc),
              "does not fit in int32");
  bad = t;
  bad.num_sc_per_chip = int64_t{1} << 20;
  CHECK_ERROR(sce::ConvertToListOfCoo(ragged, 4, sce::Combiner::kSum, bad, -1, {"t", "f"}, &per_sc),
              "num_sc_per_chip must be in [1, 1024]");

  g_test = "sort, minibatch splits and CSR reject wrapping attributes";
  IntVec rows = {0, 1, 1}, cols = {0, 4, 8};
  FloatVec g3 = {1, 1, 1};
  std::vector<sce::FeatureCooView> features(1);
  features[0] = {rows.data(), cols.data(), g3.data(), 3, 3, 3, 2, 0};
  sce::SortedCoo sorted;
  CHECK_ERROR(sce::SortListOfCoo(features, int64_t{1} << 62, 4, 8, 8, "t", &sorted),
              "num_replica must be in");
  CHECK_ERROR(sce::SortListOfCoo(features, 1, int64_t{1} << 62, 8, 8, "t", &sorted),
              "num_sc_per_chip must be in");
  sce::MinibatchSplitsParams mp;
  mp.sample_count = 4;
  mp.num_replica = int64_t{1} << 60;
  mp.num_sc_per_chip = 4;
  mp.table_vocab_size = 64;
  mp.max_ids_per_partition = mp.max_unique_ids_per_partition = 8;
  mp.table_name = "t";
  sce::MinibatchSplits splits_out;
  CHECK_ERROR(sce::GetMinibatchSplits(rows.data(), cols.data(), g3.data(), 3, 3, 3, mp, &splits_out),
              "num_replica must be in");
  mp.num_replica = 1;
  mp.table_vocab_size = std::numeric_limits<int64_t>::max();  // ceil division must not overflow
  CHECK_OK(sce::GetMinibatchSplits(rows.data(), cols.data(), g3.data(), 3, 3, 3, mp, &splits_out));
  mp.num_replica = 65536;  // 4 * 4 * 65536 * 64 id_counts: over kMaxIdCounts
  mp.table_vocab_size = 64;
  CHECK_ERROR(sce::GetMinibatchSplits(rows.data(), cols.data(), g3.data(), 3, 3, 3, mp, &splits_out),
              "exceeds the limit of 16777216");
  sce::CsrParams cp;
  cp.num_sc_per_chip = 2;
  cp.max_ids_buffer_size = 64;
  cp.table_name = "t";
  sce::CsrBufferSizes sizes;
  cp.max_minibatches_per_sc = int64_t{1} << 58;
  CHECK_ERROR(sce::GetCsrBufferSizes(cp, &sizes), "the row-pointer buffer size");
  cp.max_minibatches_per_sc = 1;
  cp.num_replica = int64_t{1} << 40;
  CHECK_ERROR(sce::GetCsrBufferSizes(cp, &sizes), "num_replica must be in");
  cp.num_replica = 1;
  cp.max_ids_buffer_size = int64_t{1} << 40;
  CHECK_ERROR(sce::GetCsrBufferSizes(cp, &sizes), "int32 position limit");
  cp.max_ids_buffer_size = 64;
  CHECK_OK(sce::GetCsrBufferSizes(cp, &sizes));
  CHECK_EQ(sizes.row_pointers, int64_t{16});

  g_test = "split encoding ignores impossible levels and points";
  CHECK(sce::BinaryToBucketSplits(-1, 64).empty());
  CHECK(sce::BinaryToBucketSplits(-1, -3).empty());
  CHECK_EQ(sce::BucketSplitsToBinary({0, 64, -5, 1 << 30}, 6), int64_t{0});
  CHECK_EQ(sce::BucketSplitsToBinary({32}, 70), int64_t{0});
  CHECK_EQ(sce::BucketSplitsToBinary({32}, 6), int64_t{1});

  g_test = "layout stacker: huge partition / SparseCore counts and vocabularies";
  sce::LayoutStacker huge_cores(1, int64_t{1} << 61, false);
  CHECK_ERROR(huge_cores.AddTable("a", 10, 8, "g", 0, 1), "sparse_cores_per_partition must be in");
  sce::LayoutStacker huge_partitions(int64_t{1} << 62, 4, false);
  CHECK_ERROR(huge_partitions.AddTable("a", 10, 8, "g", 0, 1), "num_partitions must be in");
  sce::LayoutStacker stacker(1, 4, false);
  CHECK_ERROR(stacker.AddTable("a", std::numeric_limits<int64_t>::max(), 8, "g", 0, 1),
              "table 'a': vocabulary size 9223372036854775807 overflows when padded");
  CHECK_ERROR(stacker.AddTable("b", 10, std::numeric_limits<int64_t>::max(), "g", 0, 1),
              "table 'b': dim 9223372036854775807 overflows when padded");
  CHECK_ERROR(stacker.AddTable("c", (int64_t{1} << 31), 8, "g", 0, 1), "more than the limit");
  CHECK_ERROR(stacker.AddTable("d", 10, int64_t{1} << 60, "g", int64_t{1} << 40, 1),
              "overflows");
  CHECK_OK(stacker.AddTable("e", 10, 8, "g", 16, 1));
}

void TestRequireFiniteFeatureGradients() {
  g_test = "feature gradient check: passes, names every marked feature, rejects bad sizes";
  const std::vector<std::string> features = {"a", "b", "c"};
  const std::vector<std::string> tables = {"t", "t", "u"};
  const int32_t none[] = {0, 0, 0};
  CHECK_OK(sce::RequireFiniteFeatureGradients(none, 3, features, tables));
  const int32_t two[] = {1, 0, 5};
  CHECK_ERROR(sce::RequireFiniteFeatureGradients(two, 3, features, tables),
              "feature 'a' (table 't'), feature 'c' (table 'u'): the gradient");
  CHECK_ERROR(sce::RequireFiniteFeatureGradients(two, 2, features, tables),
              "one entry per feature");
  CHECK_ERROR(sce::RequireFiniteFeatureGradients(two, -1, features, tables),
              "one entry per feature");
  CHECK_ERROR(sce::RequireFiniteFeatureGradients(nullptr, 3, features, tables), "missing");
  CHECK_OK(sce::RequireFiniteFeatureGradients(nullptr, 0, {}, {}));

  g_test = "AllFinite: NaN, +-Inf anywhere; denormals, zeros and extremes are finite";
  std::vector<float> values(37, 1.5f);
  values[3] = -0.0f;
  values[5] = std::numeric_limits<float>::denorm_min();
  values[7] = std::numeric_limits<float>::max();
  values[9] = -std::numeric_limits<float>::max();
  CHECK(sce::AllFinite(values.data(), 37));
  CHECK(sce::AllFinite(nullptr, 0));
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (int at : {0, 17, 36}) {
      std::vector<float> copy = values;
      copy[at] = bad;
      CHECK(!sce::AllFinite(copy.data(), 37));
    }
  }
}

void TestRaisePartitionLimits() {
  g_test = "online limits: raised to larger statistics only, one message per raise";
  std::vector<int32_t> limits = {4, 4, 8, 8};
  std::vector<std::string> changes;
  CHECK_OK(sce::RaisePartitionLimits(limits.data(), std::vector<int32_t>{6, 3, 8, 9}.data(), 4,
                                     {"a", "b"}, &changes));
  CHECK(limits == (std::vector<int32_t>{6, 4, 8, 9}));
  CHECK_EQ(changes.size(), size_t{2});
  CHECK(changes[0] == "table 'a': max_ids_per_partition raised online from 4 to 6 (the largest "
                      "value measured on any replica)");
  CHECK(changes[1].find("table 'b': max_unique_ids_per_partition raised online from 8 to 9") == 0);
  CHECK_ERROR(sce::RaisePartitionLimits(limits.data(), std::vector<int32_t>{7, 7, -1, 0}.data(),
                                        4, {"a", "b"}, &changes),
              "table 'b': max_ids_per_partition statistic must be >= 0");
  CHECK(limits == (std::vector<int32_t>{6, 4, 8, 9}));  // nothing written
  CHECK_ERROR(sce::RaisePartitionLimits(limits.data(), limits.data(), 3, {"a", "b"}, &changes),
              "2 entries per stacked table");
}


// ---- Open vocabularies: the key-to-row map (docs/dynamic_vocabulary.md) -------------------------

struct MappedStep {
  std::vector<int32_t> rows;
  std::vector<uint64_t> new_keys;
  std::vector<int32_t> new_rows;
  sce::KeyRowMapStepStats stats;
};

MappedStep MapKeys(sce::KeyRowMap* map, int64_t step, const std::vector<int64_t>& keys) {
  MappedStep out;
  std::vector<uint64_t> words(keys.begin(), keys.end());
  out.rows.assign(keys.size(), 99);
  CHECK_OK(map->MapStep(step, words.data(), static_cast<int64_t>(words.size()), out.rows.data(),
                        &out.new_keys, &out.new_rows, &out.stats));
  return out;
}

std::unique_ptr<sce::KeyRowMap> NewKeyRowMap(int64_t capacity, int64_t threshold,
                                             int64_t steps_to_live, int64_t pending_capacity = 8) {
  sce::KeyRowMapConfig config;
  config.capacity = capacity;
  config.admission_threshold = threshold;
  config.steps_to_live = steps_to_live;
  config.pending_capacity = pending_capacity;
  std::unique_ptr<sce::KeyRowMap> map;
  CHECK_OK(sce::KeyRowMap::Create("table 'users'", config, &map));
  return map;
}

void TestKeyRowMapAdmission() {
  g_test = "key map: threshold 1 admits on first sight, in batch order; a full map refuses";
  auto map = NewKeyRowMap(3, 1, 0);
  MappedStep s0 = MapKeys(map.get(), 0, {5, -3, 5, 7});
  CHECK(s0.rows == (std::vector<int32_t>{0, 1, 0, 2}));
  CHECK(s0.new_keys == (std::vector<uint64_t>{5, static_cast<uint64_t>(-3), 7}));
  CHECK(s0.new_rows == (std::vector<int32_t>{0, 1, 2}));
  CHECK_EQ(s0.stats.admitted_keys, int64_t{3});
  MappedStep s1 = MapKeys(map.get(), 1, {8, 7, 8});
  CHECK(s1.rows == (std::vector<int32_t>{sce::kNoRow, 2, sce::kNoRow}));
  CHECK_EQ(s1.stats.refused_keys, int64_t{1});
  CHECK_EQ(s1.stats.unadmitted_ids, int64_t{2});
  CHECK(s1.new_keys.empty());
  const sce::KeyRowMapState state = map->Export();
  CHECK(state.keys == (std::vector<uint64_t>{static_cast<uint64_t>(-3), 5, 7}));  // signed order
  CHECK(state.rows == (std::vector<int32_t>{1, 0, 2}));
  CHECK(state.last_seen == (std::vector<int32_t>{0, 0, 1}));

  g_test = "key map: the occurrence reaching the threshold admits; earlier ones in its step read "
           "the row too";
  auto counted = NewKeyRowMap(4, 3, 0);
  MappedStep c0 = MapKeys(counted.get(), 0, {9, 9, 4});
  CHECK(c0.rows == (std::vector<int32_t>{sce::kNoRow, sce::kNoRow, sce::kNoRow}));
  CHECK_EQ(c0.stats.unadmitted_ids, int64_t{3});
  MappedStep c1 = MapKeys(counted.get(), 1, {4, 9, 1, 1, 9, 1});
  CHECK(c1.rows == (std::vector<int32_t>{sce::kNoRow, 0, 1, 1, 0, 1}));
  CHECK(c1.new_keys == (std::vector<uint64_t>{9, 1}));
  CHECK_EQ(c1.stats.unadmitted_ids, int64_t{1});
  const sce::KeyRowMapState pending = counted->Export();
  CHECK(pending.pending_keys == (std::vector<uint64_t>{4}));
  CHECK(pending.pending_counts == (std::vector<int32_t>{2}));
  CHECK(pending.pending_last_seen == (std::vector<int32_t>{1}));
}

void TestKeyRowMapNumbering() {
  g_test = "key map: a step's rows numbered by first occurrence, kNoRow once, the map unchanged";
  auto map = NewKeyRowMap(2, 1, 3);
  std::vector<int32_t> positions(1), unique;
  // Before any step only kNoRow is an answer.
  const int32_t none = sce::kNoRow;
  CHECK_OK(map->NumberStepRows(&none, 1, positions.data(), &unique));
  CHECK(positions == std::vector<int32_t>{0});
  CHECK(unique == std::vector<int32_t>{sce::kNoRow});
  MappedStep s0 = MapKeys(map.get(), 4, {30, 10, 30, 50, 10, 60, 50});
  CHECK(s0.rows == (std::vector<int32_t>{0, 1, 0, sce::kNoRow, 1, sce::kNoRow, sce::kNoRow}));
  positions.assign(s0.rows.size(), 99);
  CHECK_OK(map->NumberStepRows(s0.rows.data(), 7, positions.data(), &unique));
  CHECK(positions == (std::vector<int32_t>{0, 1, 0, 2, 1, 2, 2}));
  CHECK(unique == (std::vector<int32_t>{0, 1, sce::kNoRow}));
  CHECK(map->Export().last_seen == (std::vector<int32_t>{4, 4}));   // restored
  std::vector<int32_t> again = {1, 1, 0};   // any rows of the step, in any order
  CHECK_OK(map->NumberStepRows(again.data(), 3, positions.data(), &unique));
  CHECK(unique == (std::vector<int32_t>{1, 0}));
  CHECK(positions[0] == 0 && positions[1] == 0 && positions[2] == 1);

  g_test = "key map: numbering fails on a row out of range or not given in the last step, and "
           "changes nothing";
  std::vector<int32_t> bad = {0, 2};
  CHECK_ERROR(map->NumberStepRows(bad.data(), 2, positions.data(), &unique), "rows[1] = 2");
  CHECK(unique.empty());
  bad = {1, -2};
  CHECK_ERROR(map->NumberStepRows(bad.data(), 2, positions.data(), &unique), "rows[1] = -2");
  MappedStep s1 = MapKeys(map.get(), 5, {10});
  bad = {1, 0};
  CHECK_ERROR(map->NumberStepRows(bad.data(), 2, positions.data(), &unique),
              "rows[1] = 0 was not given in step 5");
  const sce::KeyRowMapState state = map->Export();
  CHECK(state.last_seen == (std::vector<int32_t>{5, 4}));   // keys 10 and 30, unchanged
  CHECK_OK(map->NumberStepRows(s1.rows.data(), 1, positions.data(), &unique));
  CHECK(unique == std::vector<int32_t>{1});
  CHECK_ERROR(map->NumberStepRows(nullptr, 1, positions.data(), &unique), "bad row numbering");
}

void TestKeyRowMapEviction() {
  g_test = "key map: steps_to_live takes rows back lazily; taken-back rows are reused";
  auto map = NewKeyRowMap(2, 1, 2);
  MapKeys(map.get(), 0, {100});
  MapKeys(map.get(), 1, {200});
  // Step 3: key 100 (last seen 0) has been unseen for 3 > 2 steps: it is admitted afresh.
  MappedStep s3 = MapKeys(map.get(), 3, {100, 300});
  CHECK(s3.new_keys == (std::vector<uint64_t>{100}));
  CHECK_EQ(s3.rows[0], 0);
  CHECK_EQ(s3.stats.evicted_keys, int64_t{1});
  CHECK_EQ(s3.rows[1], sce::kNoRow);  // 200 (last seen 1) still holds its row
  CHECK_EQ(s3.stats.refused_keys, int64_t{1});
  MappedStep s4 = MapKeys(map.get(), 4, {300});  // 200 expires: the sweep frees its row
  CHECK_EQ(s4.rows[0], 1);
  CHECK(s4.new_rows == (std::vector<int32_t>{1}));
  CHECK_EQ(s4.stats.evicted_keys, int64_t{1});
  const sce::KeyRowMapState state = map->Export();
  CHECK(state.keys == (std::vector<uint64_t>{100, 300}));
  // Export leaves out keys that have lost their rows by the last step, swept or not.
  MapKeys(map.get(), 7, {});
  CHECK(map->Export().keys.empty());
  CHECK_EQ(map->size(), int64_t{2});

  g_test = "key map: a full pending table forgets keys not seen in the step, then stops counting";
  auto counted = NewKeyRowMap(4, 5, 0, 2);
  MapKeys(counted.get(), 0, {1, 2});
  MappedStep c1 = MapKeys(counted.get(), 1, {3, 4, 5});
  CHECK_EQ(c1.stats.untracked_ids, int64_t{1});
  CHECK_EQ(c1.stats.unadmitted_ids, int64_t{3});
  CHECK(counted->Export().pending_keys == (std::vector<uint64_t>{3, 4}));
}

void TestKeyRowMapStateAndErrors() {
  g_test = "key map: Import gives key i row i and continues like the exported map";
  auto map = NewKeyRowMap(6, 2, 3);
  MapKeys(map.get(), 0, {10, -20, 10, 30});
  MapKeys(map.get(), 2, {30, 40, 40, -20});
  sce::KeyRowMapState state = map->Export();
  CHECK(state.keys == (std::vector<uint64_t>{static_cast<uint64_t>(-20), 10, 30, 40}));
  CHECK(state.pending_keys.empty());
  auto restored = NewKeyRowMap(6, 2, 3);
  CHECK_OK(restored->Import(state));
  CHECK(restored->Export().rows == (std::vector<int32_t>{0, 1, 2, 3}));
  const std::vector<int64_t> next = {10, 50, 50, 60, -20, 30};
  MappedStep a = MapKeys(map.get(), 4, next);
  MappedStep b = MapKeys(restored.get(), 4, next);
  CHECK(a.new_keys == b.new_keys);
  for (size_t i = 0; i < next.size(); ++i) CHECK_EQ(a.rows[i] == sce::kNoRow, b.rows[i] == sce::kNoRow);
  sce::KeyRowMapState after_a = map->Export(), after_b = restored->Export();
  CHECK(after_a.keys == after_b.keys && after_a.last_seen == after_b.last_seen);
  CHECK(after_a.pending_keys == after_b.pending_keys);
  CHECK(after_a.pending_counts == after_b.pending_counts);

  g_test = "key map: bad arguments fail naming the table and change nothing";
  sce::KeyRowMapConfig bad;
  bad.capacity = 0;
  std::unique_ptr<sce::KeyRowMap> none;
  CHECK_ERROR(sce::KeyRowMap::Create("table 'users'", bad, &none), "table 'users': capacity");
  bad.capacity = 4;
  bad.admission_threshold = 0;
  CHECK_ERROR(sce::KeyRowMap::Create("table 'users'", bad, &none), "admission_threshold");
  bad.admission_threshold = 1;
  bad.steps_to_live = -1;
  CHECK_ERROR(sce::KeyRowMap::Create("table 'users'", bad, &none), "steps_to_live");
  const sce::KeyRowMapState before = map->Export();
  std::vector<int32_t> rows(1);
  std::vector<uint64_t> keys = {10}, new_keys;
  std::vector<int32_t> new_rows;
  sce::KeyRowMapStepStats stats;
  CHECK_ERROR(map->MapStep(3, keys.data(), 1, rows.data(), &new_keys, &new_rows, &stats),
              "step 3 comes before the last mapped step 4");
  CHECK_ERROR(map->MapStep(int64_t{1} << 31, keys.data(), 1, rows.data(), &new_keys, &new_rows,
                           &stats),
              "table 'users': step must be in [0, 2147483647]");
  sce::KeyRowMapState too_many = before;
  too_many.keys = {1, 2, 3, 4, 5, 6, 7};
  too_many.last_seen.assign(7, 0);
  CHECK_ERROR(map->Import(too_many), "holds 7 keys, more than the capacity of 6 rows");
  sce::KeyRowMapState unsorted = before;
  std::swap(unsorted.keys[0], unsorted.keys[1]);
  CHECK_ERROR(map->Import(unsorted), "strictly ascending");
  sce::KeyRowMapState future = before;
  future.last_seen[0] = 9;
  CHECK_ERROR(map->Import(future), "last-seen step 9 is outside [0, 4]");
  sce::KeyRowMapState both = before;
  both.pending_keys = {before.keys[1]};
  both.pending_counts = {1};
  both.pending_last_seen = {0};
  CHECK_ERROR(map->Import(both), "is both held and pending");
  const sce::KeyRowMapState after = map->Export();
  CHECK(after.keys == before.keys && after.rows == before.rows &&
        after.last_seen == before.last_seen && after.last_step == before.last_step);
}

void TestKeyRowMapMatchesReference() {
  g_test = "key map: random steps agree with the reference model; rows stay consistent";
  std::mt19937_64 rng(20261127);
  for (int trial = 0; trial < 300; ++trial) {
    sce::KeyRowMapConfig config;
    config.capacity = 1 + static_cast<int64_t>(rng() % 40);
    config.admission_threshold = 1 + static_cast<int64_t>(rng() % 3);
    config.steps_to_live = static_cast<int64_t>(rng() % 4);
    config.pending_capacity = 1 + static_cast<int64_t>(rng() % 30);
    std::unique_ptr<sce::KeyRowMap> map;
    CHECK_OK(sce::KeyRowMap::Create("t", config, &map));
    sce_testing::ReferenceKeyRowMap reference(config);
    const uint64_t universe = 1 + rng() % 80;
    std::map<uint64_t, int32_t> row_of;  // the rows held after the previous step
    int64_t step = 0;
    bool agree = true, consistent = true;
    for (int s = 0; s < 25; ++s) {
      step += static_cast<int64_t>(rng() % 3);
      std::vector<uint64_t> keys(rng() % 30);
      for (uint64_t& k : keys) k = (rng() % universe) * 0x9e3779b97f4a7c15ULL;
      std::vector<int32_t> rows(keys.size());
      std::vector<uint64_t> new_keys, expected_new;
      std::vector<int32_t> new_rows;
      sce::KeyRowMapStepStats stats, expected_stats;
      CHECK_OK(map->MapStep(step, keys.data(), static_cast<int64_t>(keys.size()), rows.data(),
                            &new_keys, &new_rows, &stats));
      const std::vector<bool> has_row = reference.MapStep(step, keys, &expected_new, &expected_stats);
      agree = agree && new_keys == expected_new && stats.admitted_keys == expected_stats.admitted_keys &&
              stats.refused_keys == expected_stats.refused_keys &&
              stats.unadmitted_ids == expected_stats.unadmitted_ids &&
              stats.untracked_ids == expected_stats.untracked_ids;
      std::map<uint64_t, int32_t> step_rows;
      std::set<uint64_t> admitted(new_keys.begin(), new_keys.end());
      for (size_t i = 0; i < keys.size(); ++i) {
        agree = agree && (rows[i] != sce::kNoRow) == has_row[i];
        if (rows[i] == sce::kNoRow) continue;
        consistent = consistent && rows[i] >= 0 && rows[i] < config.capacity;
        auto [it, inserted] = step_rows.emplace(keys[i], rows[i]);
        consistent = consistent && it->second == rows[i];  // one row per key in a step
        if (!admitted.count(keys[i]) && row_of.count(keys[i])) {
          consistent = consistent && row_of[keys[i]] == rows[i];  // kept from the last step
        }
      }
      const sce::KeyRowMapState state = map->Export(), expected = reference.Export();
      agree = agree && state.keys == expected.keys && state.last_seen == expected.last_seen &&
              state.pending_keys == expected.pending_keys &&
              state.pending_counts == expected.pending_counts &&
              state.pending_last_seen == expected.pending_last_seen;
      std::set<int32_t> distinct(state.rows.begin(), state.rows.end());
      consistent = consistent && distinct.size() == state.rows.size();  // never shared
      row_of.clear();
      for (size_t k = 0; k < state.keys.size(); ++k) row_of[state.keys[k]] = state.rows[k];
    }
    CHECK(agree);
    CHECK(consistent);
  }

  g_test = "key map: owner shards are a fixed function of the key, spread evenly";
  std::vector<int> per_shard(4, 0);
  for (int64_t key = -2000; key < 2000; ++key) {
    const int32_t shard = sce::KeyOwnerShard(static_cast<uint64_t>(key), 4);
    CHECK(shard >= 0 && shard < 4);
    CHECK_EQ(shard, sce::KeyOwnerShard(static_cast<uint64_t>(key), 4));
    ++per_shard[shard];
  }
  for (int count : per_shard) CHECK(count > 900 && count < 1100);
  CHECK_EQ(sce::KeyOwnerShard(12345, 1), 0);
  const uint64_t some_keys[] = {static_cast<uint64_t>(-3), 0, 1, 2, 99};
  int32_t owners[5];
  sce::KeyOwnerShards(some_keys, 5, 4, owners);
  // The numbers tests/reference/key_hashing.py computes (its mirror of the mix).
  const int32_t want_owners[] = {3, 2, 0, 3, 2};
  for (int i = 0; i < 5; ++i) CHECK_EQ(owners[i], want_owners[i]);

  g_test = "key values: keyed uniforms are in (0, 1), a function of (seed, key, column) only";
  CHECK_EQ(sce::KeyedUniform(0, 0, 0), 0x1.20dc88p-3f);
  CHECK_EQ(sce::KeyedUniform(7, static_cast<uint64_t>(-5), 3), 0x1.2efe24p-2f);
  CHECK_EQ(sce::KeyedUniform(123456789, uint64_t{1} << 40, 31), 0x1.ca6e6cp-2f);
  std::vector<uint64_t> many(4000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<uint64_t>(i) - 2000;
  std::vector<float> uniforms(many.size() * 3);
  sce::KeyedRandomRows(11, many.data(), static_cast<int64_t>(many.size()), 3,
                       sce::KeyedDistribution::kUniform, 0.0, 1.0, uniforms.data());
  double sum = 0.0;
  for (size_t i = 0; i < many.size(); ++i) {
    for (int j = 0; j < 3; ++j) {
      const float u = uniforms[i * 3 + j];
      CHECK(u > 0.0f && u < 1.0f);
      CHECK_EQ(u, sce::KeyedUniform(11, many[i], j));
      sum += u;
    }
  }
  const double mean = sum / static_cast<double>(uniforms.size());
  CHECK(mean > 0.49 && mean < 0.51);
  CHECK(sce::KeyedUniform(11, 5, 0) != sce::KeyedUniform(12, 5, 0));
  CHECK(sce::KeyedUniform(11, 5, 0) != sce::KeyedUniform(11, 5, 1));
}

void TestKeyedRandomRows() {
  g_test = "key values: the inverse normal distribution function";
  CHECK(std::fabs(sce::InverseNormal(0.5)) < 1e-15);
  CHECK(std::fabs(sce::InverseNormal(0.975) - 1.959963984540054) < 1e-12);
  CHECK(std::fabs(sce::InverseNormal(0.001) + 3.090232306167813) < 1e-11);
  CHECK(std::fabs(sce::InverseNormal(1.0 / 16777216.0) + 5.294704084854597) < 1e-12);
  for (int k = 1; k < 1000; ++k) {
    const double p = k / 1000.0;
    const double x = sce::InverseNormal(p);
    CHECK(std::fabs(0.5 * std::erfc(-x / std::sqrt(2.0)) - p) < 1e-15 + 1e-13 * p);
    CHECK(std::fabs(x + sce::InverseNormal(1.0 - p)) < 1e-12);
  }

  g_test = "key values: rows follow their distribution, the same however many are drawn";
  std::vector<uint64_t> keys(2000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<uint64_t>(i) * 7919 - 5;
  const int64_t n = static_cast<int64_t>(keys.size());
  std::vector<float> normal(keys.size() * 4), truncated(keys.size() * 4), one(4);
  sce::KeyedRandomRows(3, keys.data(), n, 4, sce::KeyedDistribution::kNormal, 1.0, 0.5,
                       normal.data());
  sce::KeyedRandomRows(3, keys.data(), n, 4, sce::KeyedDistribution::kTruncatedNormal, 0.0,
                       2.0, truncated.data());
  double mean = 0.0, square = 0.0;
  for (size_t i = 0; i < normal.size(); ++i) {
    mean += normal[i];
    square += (normal[i] - 1.0) * (normal[i] - 1.0);
    CHECK(std::fabs(truncated[i]) <= 4.0f);
  }
  mean /= static_cast<double>(normal.size());
  CHECK(std::fabs(mean - 1.0) < 0.02);
  CHECK(std::fabs(std::sqrt(square / static_cast<double>(normal.size())) - 0.5) < 0.02);
  for (int64_t i : {int64_t{0}, int64_t{777}, n - 1}) {
    sce::KeyedRandomRows(3, &keys[i], 1, 4, sce::KeyedDistribution::kNormal, 1.0, 0.5,
                         one.data());
    for (int j = 0; j < 4; ++j) CHECK_EQ(one[j], normal[i * 4 + j]);
  }
}


// Shards of one table lending rows: what the exchange does in a step (exchanges/dynamic.py).
// Every map steps with wait=true; maps with free rows lend them, in shard order, to maps with
// waiting keys, in shard order; then every map finishes its step.
struct ShardedStep {
  std::vector<std::vector<int32_t>> rows;  // per shard: its keys' rows of the whole table
  int64_t admitted = 0, refused = 0, free_after = 0;
};

ShardedStep StepShards(std::vector<std::unique_ptr<sce::KeyRowMap>>& maps, int64_t step,
                       const std::vector<std::vector<uint64_t>>& keys) {
  const size_t W = maps.size();
  ShardedStep out;
  out.rows.resize(W);
  std::vector<int64_t> waiting(W), free(W);
  std::vector<std::vector<uint64_t>> new_keys(W);
  std::vector<std::vector<int32_t>> new_rows(W);
  for (size_t r = 0; r < W; ++r) {
    sce::KeyRowMapStepStats stats;
    out.rows[r].assign(keys[r].size(), 99);
    CHECK_OK(maps[r]->MapStep(step, keys[r].data(), static_cast<int64_t>(keys[r].size()),
                              out.rows[r].data(), &new_keys[r], &new_rows[r], &stats, true));
    waiting[r] = stats.waiting_keys;
    free[r] = maps[r]->FreeRows(&stats);
    CHECK(waiting[r] == 0 || free[r] == 0);
    out.admitted += stats.admitted_keys;
  }
  std::vector<std::vector<int32_t>> lent(W);
  size_t lender = 0;
  for (size_t r = 0; r < W; ++r) {
    int64_t need = waiting[r];
    while (need > 0) {
      while (lender < W && free[lender] == 0) ++lender;
      if (lender == W) break;
      const int64_t take = std::min(need, free[lender]);
      CHECK_OK(maps[lender]->LendRows(take, &lent[r]));
      free[lender] -= take;
      need -= take;
    }
  }
  for (size_t r = 0; r < W; ++r) {
    sce::KeyRowMapStepStats stats;
    CHECK_OK(maps[r]->FinishStep(lent[r].data(), static_cast<int64_t>(lent[r].size()),
                                 keys[r].data(), static_cast<int64_t>(keys[r].size()),
                                 out.rows[r].data(), &new_keys[r], &new_rows[r], &stats));
    out.admitted += stats.admitted_keys;
    out.refused += stats.refused_keys;
    maps[r]->ToTableRows(out.rows[r].data(), static_cast<int64_t>(out.rows[r].size()));
    out.free_after += maps[r]->FreeRows(&stats);
  }
  return out;
}

sce::KeyRowMapState TableRowState(const sce::KeyRowMap& map) {
  sce::KeyRowMapState state = map.Export();
  map.ToTableRows(state.rows.data(), static_cast<int64_t>(state.rows.size()));
  return state;
}

std::vector<std::unique_ptr<sce::KeyRowMap>> NewShardMaps(int64_t total, int64_t shards,
                                                          sce::KeyRowMapConfig config) {
  std::vector<std::unique_ptr<sce::KeyRowMap>> maps(shards);
  int64_t first = 0;
  for (int64_t r = 0; r < shards; ++r) {
    config.capacity = total / shards + (r < total % shards ? 1 : 0);
    config.total_rows = total;
    config.first_row = first;
    first += config.capacity;
    CHECK_OK(sce::KeyRowMap::Create("t", config, &maps[r]));
  }
  return maps;
}

void TestKeyRowMapLending() {
  g_test = "key map: shards lend free rows to shards with waiting keys; lent rows travel on";
  sce::KeyRowMapConfig config;
  config.steps_to_live = 1;
  auto maps = NewShardMaps(4, 2, config);   // shard 0: rows 0-1, shard 1: rows 2-3
  ShardedStep s0 = StepShards(maps, 0, {{1, 2, 3, 1}, {10}});
  CHECK(s0.rows[0] == (std::vector<int32_t>{0, 1, 3, 0}));   // key 3 holds shard 1's row 3
  CHECK(s0.rows[1] == (std::vector<int32_t>{2}));
  CHECK_EQ(s0.refused, int64_t{0});
  CHECK_EQ(maps[0]->local_rows(), int64_t{3});
  ShardedStep s1 = StepShards(maps, 1, {{4, 3}, {10}});   // every row is taken: 4 is refused
  CHECK(s1.rows[0] == (std::vector<int32_t>{sce::kNoRow, 3}));
  CHECK_EQ(s1.refused, int64_t{1});
  CHECK_EQ(s1.free_after, int64_t{0});
  // Step 3: keys 1 and 2 (last seen at 0) and 10 have expired; 3 (seen at 1) has not. Key 11 of
  // shard 1 and 4, 5, 6 of shard 0 want rows: shard 0 has 2 free rows, shard 1 lends its only one.
  // Step 2: keys 1 and 2 (last seen at 0) have expired, 3 and 10 (seen at 1) have not. Shard 1
  // has no row left for 11 and 12: shard 0 lends it rows 1 and 0 (its free rows, last taken
  // back first).
  ShardedStep s2 = StepShards(maps, 2, {{}, {11, 12, 10}});
  CHECK(s2.rows[1] == (std::vector<int32_t>{1, 0, 2}));
  CHECK_EQ(s2.refused, int64_t{0});
  // Step 3: key 3 has expired; its row (lent by shard 1) goes to key 7.
  ShardedStep s3 = StepShards(maps, 3, {{7}, {11}});
  CHECK(s3.rows[0] == (std::vector<int32_t>{3}));
  CHECK(s3.rows[1] == (std::vector<int32_t>{1}));
  const sce::KeyRowMapState state0 = TableRowState(*maps[0]), state1 = TableRowState(*maps[1]);
  CHECK(state0.keys == (std::vector<uint64_t>{7}));
  CHECK(state0.rows == (std::vector<int32_t>{3}));
  CHECK(state1.rows == (std::vector<int32_t>{2, 1, 0}));   // keys 10, 11, 12
  // Lent rows leave with their state: an import places them again.
  auto restored = NewShardMaps(4, 2, config);
  sce::KeyRowMapPlacement place0{{3}, {0, 1}}, place1{{2, 1, 0}, {3}};
  CHECK_OK(restored[0]->Import(state0, &place0));
  CHECK_OK(restored[1]->Import(state1, &place1));
  CHECK(TableRowState(*restored[0]).rows == state0.rows);
  CHECK(TableRowState(*restored[1]).rows == state1.rows);
  // Step 4: 10 and 12 have expired. Shard 1 gives 13 one of their rows and lends 8 the other.
  ShardedStep s4 = StepShards(restored, 4, {{8}, {13}});
  CHECK_EQ(s4.refused, int64_t{0});
  CHECK(s4.rows[1] == (std::vector<int32_t>{0}));
  CHECK(s4.rows[0] == (std::vector<int32_t>{2}));
  ShardedStep again = StepShards(restored, 4, {{9, 8}, {13}});   // every row is taken
  CHECK(again.rows[0] == (std::vector<int32_t>{sce::kNoRow, 2}));
  CHECK_EQ(again.refused, int64_t{1});
  // Import checks the rows it is given.
  auto fresh = NewShardMaps(4, 2, config);
  sce::KeyRowMapPlacement twice{{2, 2, 0}, {}}, foreign_lent{{2, 1, 0}, {0}}, outside{{4}, {}};
  CHECK_ERROR(fresh[1]->Import(state1, &twice), "given twice");
  CHECK_ERROR(fresh[1]->Import(state1, &foreign_lent), "not a row of this map");
  CHECK_ERROR(fresh[0]->Import(state0, &outside), "outside the 4 rows");
  CHECK_EQ(fresh[0]->size(), int64_t{0});
  // Misuse fails and changes nothing.
  std::vector<int32_t> out;
  CHECK_ERROR(fresh[0]->LendRows(3, &out), "cannot lend 3 rows");
  std::vector<uint64_t> nk;
  std::vector<int32_t> nr;
  sce::KeyRowMapStepStats st;
  CHECK_ERROR(fresh[0]->FinishStep(nullptr, 0, nullptr, 0, nullptr, &nk, &nr, &st),
              "without a waiting MapStep");
}

void TestKeyRowMapShardsShareCapacity() {
  g_test = "key map: shards lending rows refuse only when every row is taken, never share one";
  std::mt19937_64 rng(20261128);
  for (int trial = 0; trial < 300; ++trial) {
    sce::KeyRowMapConfig config;
    const int64_t shards = 2 + static_cast<int64_t>(rng() % 3);
    const int64_t total = shards + static_cast<int64_t>(rng() % 30);
    config.admission_threshold = 1 + static_cast<int64_t>(rng() % 3);
    config.steps_to_live = static_cast<int64_t>(rng() % 4);
    config.pending_capacity = 1000;
    auto maps = NewShardMaps(total, shards, config);
    sce::KeyRowMapConfig single = config;
    single.capacity = total;
    sce_testing::ReferenceKeyRowMap reference(single);
    const uint64_t universe = 1 + rng() % 60;
    int64_t step = 0;
    bool same_keys = true, never_refused = true;
    for (int s = 0; s < 25; ++s) {
      step += 1 + static_cast<int64_t>(rng() % 2);
      std::vector<uint64_t> batch(rng() % 30);
      for (uint64_t& k : batch) k = (rng() % universe) * 0x9e3779b97f4a7c15ULL;
      std::vector<std::vector<uint64_t>> keys(shards);
      for (uint64_t k : batch) keys[sce::KeyOwnerShard(k, static_cast<int32_t>(shards))].push_back(k);
      const ShardedStep out = StepShards(maps, step, keys);
      if (out.refused > 0) CHECK_EQ(out.free_after, int64_t{0});
      std::vector<uint64_t> by_shard, expected_new;
      for (const auto& part : keys) by_shard.insert(by_shard.end(), part.begin(), part.end());
      sce::KeyRowMapStepStats expected;
      reference.MapStep(step, by_shard, &expected_new, &expected);
      never_refused = never_refused && out.refused == 0 && expected.refused_keys == 0;
      // Every held row is a distinct row of the table; every answer is its key's row.
      std::map<int32_t, uint64_t> key_of_row;
      std::set<uint64_t> held;
      for (int64_t r = 0; r < shards; ++r) {
        sce::KeyRowMapState state = maps[r]->Export();
        maps[r]->ToTableRows(state.rows.data(), static_cast<int64_t>(state.rows.size()));
        for (size_t i = 0; i < state.keys.size(); ++i) {
          CHECK(state.rows[i] >= 0 && state.rows[i] < total);
          CHECK(key_of_row.emplace(state.rows[i], state.keys[i]).second);
          held.insert(state.keys[i]);
        }
        for (size_t i = 0; i < keys[r].size(); ++i) {
          const int32_t row = out.rows[r][i];
          CHECK(row == sce::kNoRow || key_of_row.at(row) == keys[r][i]);
        }
      }
      CHECK(static_cast<int64_t>(held.size()) <= total);
      if (never_refused) {
        const sce::KeyRowMapState ref = reference.Export();
        same_keys = same_keys && std::set<uint64_t>(ref.keys.begin(), ref.keys.end()) == held;
      }
    }
    CHECK(same_keys);
  }
}

void TestKeyRowMapFind() {
  g_test = "key map: Find answers held keys, -1 for the rest (expired included), changes nothing";
  auto map = NewKeyRowMap(4, 2, 1);
  MapKeys(map.get(), 0, {5, 5, 6, -7, -7});   // 5 and -7 admitted, 6 pending
  MapKeys(map.get(), 1, {-7});                // 5 (last seen 0) expires at step 2
  const sce::KeyRowMapState before = map->Export();
  std::vector<uint64_t> keys = {5, 6, static_cast<uint64_t>(-7), 8};
  std::vector<int32_t> rows(keys.size(), 99);
  map->Find(keys.data(), 4, rows.data());
  CHECK(rows[0] != sce::kNoRow && rows[2] != sce::kNoRow && rows[0] != rows[2]);
  CHECK_EQ(rows[1], sce::kNoRow);
  CHECK_EQ(rows[3], sce::kNoRow);
  const sce::KeyRowMapState after = map->Export();
  CHECK(after.keys == before.keys && after.pending_counts == before.pending_counts &&
        after.last_seen == before.last_seen && after.last_step == before.last_step);
  MapKeys(map.get(), 2, {6});   // a step later, 5 has expired: Find no longer answers it
  map->Find(keys.data(), 1, rows.data());
  CHECK_EQ(rows[0], sce::kNoRow);

  g_test = "key map: rows to reset stay listed, once each, until confirmed";
  auto fresh = NewKeyRowMap(3, 1, 1);
  MappedStep first = MapKeys(fresh.get(), 0, {1, 2});
  CHECK(fresh->rows_to_reset() == first.new_rows);
  // Step 0's writes never ran (no confirmation): step 2 evicts 1 and 2 and reuses their rows.
  MappedStep second = MapKeys(fresh.get(), 2, {3, 4, 5});
  CHECK_EQ(second.new_rows.size(), size_t{3});
  std::vector<int32_t> expected = first.new_rows;
  for (int32_t row : second.new_rows) {
    if (std::find(expected.begin(), expected.end(), row) == expected.end()) expected.push_back(row);
  }
  CHECK(fresh->rows_to_reset() == expected);
  // Each listed row comes with the key it was last given to (step 2's key for a reused row).
  std::map<int32_t, uint64_t> holder;
  for (const MappedStep* s : {&first, &second}) {
    for (size_t i = 0; i < s->new_rows.size(); ++i) holder[s->new_rows[i]] = s->new_keys[i];
  }
  CHECK_EQ(fresh->keys_to_reset().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    CHECK_EQ(fresh->keys_to_reset()[i], holder[expected[i]]);
  }
  fresh->ConfirmReset(1);
  CHECK(fresh->rows_to_reset() == std::vector<int32_t>(expected.begin() + 1, expected.end()));
  CHECK_EQ(fresh->keys_to_reset().size(), expected.size() - 1);
  fresh->ConfirmReset(100);
  CHECK(fresh->rows_to_reset().empty());
  MappedStep third = MapKeys(fresh.get(), 3, {6});   // refused: every row is held
  CHECK(third.new_rows.empty() && fresh->rows_to_reset().empty());
}

void TestStringKeyRowMap() {
  g_test = "string keys: a fingerprint's row belongs to one string; the other one is refused";
  sce::KeyRowMapConfig config;
  config.capacity = 1;
  config.steps_to_live = 1;
  std::unique_ptr<sce::StringKeyRowMap> map;
  CHECK_OK(sce::StringKeyRowMap::Create("table 'words'", config, &map));
  auto step = [&](int64_t s, const std::vector<std::string>& keys,
                  const std::vector<uint64_t>& fingerprints, int64_t* collided) {
    std::vector<std::string_view> views(keys.begin(), keys.end());
    std::vector<int32_t> rows(keys.size(), 99), new_rows;
    sce::KeyRowMapStepStats stats;
    CHECK_OK(map->MapStep(s, views.data(), fingerprints.data(), static_cast<int64_t>(keys.size()),
                          rows.data(), &new_rows, &stats, collided));
    return rows;
  };
  int64_t collided = -1;
  CHECK(step(0, {"b", "a", "b"}, {7, 7, 7}, &collided) == (std::vector<int32_t>{0, sce::kNoRow, 0}));
  CHECK_EQ(collided, int64_t{1});
  {   // Find: the holder of the fingerprint's row, not the other string
    std::vector<std::string_view> views = {"b", "a", "q"};
    std::vector<uint64_t> fingerprints = {7, 7, 9};
    std::vector<int32_t> found(3, 99);
    map->Find(views.data(), fingerprints.data(), 3, found.data());
    CHECK(found == (std::vector<int32_t>{0, sce::kNoRow, sce::kNoRow}));
  }
  sce::StringKeyRowMapState state = map->Export();
  CHECK(state.keys == (std::vector<std::string>{"b"}));
  CHECK(state.fingerprints == (std::vector<uint64_t>{7}));
  // Step 2: "b" (last seen 0) has expired; "c" takes its row, which forgets "b".
  CHECK(step(2, {"c", "b"}, {8, 7}, &collided) == (std::vector<int32_t>{0, sce::kNoRow}));
  CHECK(map->Export().keys == (std::vector<std::string>{"c"}));

  g_test = "string keys: Import gives rows in fingerprint order and rejects repeats and collisions";
  config.capacity = 4;
  CHECK_OK(sce::StringKeyRowMap::Create("table 'words'", config, &map));
  sce::StringKeyRowMapState saved;
  saved.last_step = 3;
  saved.keys = {"x", "y"};
  saved.fingerprints = {5, static_cast<uint64_t>(-3)};
  saved.last_seen = {3, 2};
  CHECK_OK(map->Import(saved));
  state = map->Export();
  CHECK(state.keys == (std::vector<std::string>{"x", "y"}));
  CHECK(state.rows == (std::vector<int32_t>{1, 0}));
  CHECK(state.last_seen == (std::vector<int32_t>{3, 2}));
  sce::StringKeyRowMapState clash = saved;
  clash.keys = {"x", "z"};
  clash.fingerprints = {5, 5};
  CHECK_ERROR(map->Import(clash), "table 'words': the saved keys 'x' and 'z' have the same fingerprint");
  clash.keys = {"x", "x"};
  CHECK_ERROR(map->Import(clash), "the saved key 'x' appears twice");
  CHECK(map->Export().keys == state.keys);
  CHECK(step(4, {"y", "x", "w"}, {static_cast<uint64_t>(-3), 5, 9}, &collided) ==
        (std::vector<int32_t>{0, 1, 2}));
}

}  // namespace

using sce_testing::RandomCsr;
using sce_testing::ReferenceFusedUpdate;
using sce_testing::TableAndSlots;

void TestShardContributionsAreMergedStably() {
  g_test = "fused update fallback: collected contributions = stable sort of the segments";
  // Sorted segments (the fallback for more than kMaxStreamedRuns runs) and unsorted ones (a CSR
  // given by hand).
  for (const auto& shape : std::vector<std::array<int64_t, 4>>{
           {1, 4, 1, 1}, {1, 4, 4, 1}, {2, 4, 4, 1}, {1, 4, 1, 0}, {1, 2, 2, 0}}) {
    for (uint32_t seed = 0; seed < 20; ++seed) {
      RandomCsr csr(seed, shape[0], shape[1], shape[2], 6, 5, shape[3] == 1);
      CHECK_OK(sce::ValidateCsrView(csr.view));
      for (int64_t p = 0; p < csr.view.local_shards(); ++p) {
        std::vector<sce::RowContribution> got, expected;
        sce::CollectShardContributions(csr.view, p, &got);
        for (int64_t sc = 0; sc < csr.view.num_source_sparse_cores(); ++sc) {
          for (int64_t b = 0; b < csr.view.num_minibatches; ++b) {
            int64_t begin, end;
            csr.view.Segment(sc, b, p, &begin, &end);
            for (int64_t i = begin; i < end; ++i) {
              if (csr.tokens[i] == sce::kPad) continue;
              expected.push_back({csr.tokens[i],
                                  static_cast<int32_t>(sc * csr.view.samples_per_sc() +
                                                       csr.samples[i]),
                                  csr.gains[i]});
            }
          }
        }
        std::stable_sort(expected.begin(), expected.end(),
                         [](const sce::RowContribution& a, const sce::RowContribution& b) {
                           return a.token < b.token;
                         });
        bool same = got.size() == expected.size();
        for (size_t i = 0; same && i < got.size(); ++i) {
          same = got[i].token == expected[i].token &&
                 got[i].activation == expected[i].activation && got[i].gain == expected[i].gain;
        }
        CHECK(same);
      }
    }
  }
}

// The instruction sets this CPU runs, widest last; the baseline always.
std::vector<sce::VectorIsa> SupportedIsas() {
  std::vector<sce::VectorIsa> isas = {sce::VectorIsa::kBaseline};
  if (sce::BestVectorIsa() != sce::VectorIsa::kBaseline) isas.push_back(sce::VectorIsa::kAvx2);
  if (sce::BestVectorIsa() == sce::VectorIsa::kAvx512) isas.push_back(sce::VectorIsa::kAvx512);
  return isas;
}

template <typename Optimizer>
void CheckIsaVersionsAgree(const float* hypers, int64_t dim, uint32_t seed) {
  RandomCsr csr(seed, 1, 4, 2, 9, 7);
  const int64_t rows = csr.view.table_rows;
  FloatVec grads(csr.view.input_size * dim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = std::sin(0.37f * i + seed) * 0.5f;
  TableAndSlots<Optimizer> baseline(rows, dim);
  sce::FusedUpdate<Optimizer>(csr.view, sce::GradientRows::InCsrOrder(csr.view, grads.data(), dim),
                              dim, 0.05f, hypers,
                              sce::Clip(), baseline.table.data(), baseline.slot_pointers,
                              sce::RunSerially, nullptr, sce::VectorIsa::kBaseline);
  CHECK(!(baseline.table == FloatVec(baseline.table.size(), 0.0f)));
  for (sce::VectorIsa isa : SupportedIsas()) {
    if (isa == sce::VectorIsa::kBaseline) continue;
    TableAndSlots<Optimizer> wide(rows, dim);
    sce::FusedUpdate<Optimizer>(csr.view, sce::GradientRows::InCsrOrder(csr.view, grads.data(), dim),
                              dim, 0.05f, hypers,
                                sce::Clip(), wide.table.data(), wide.slot_pointers,
                                sce::RunSerially, nullptr, isa);
    CHECK(baseline.SameBits(wide));
  }
}

void TestFusedUpdateIsaVersionsAgree() {
  g_test = "fused update: the AVX-512, AVX2 and baseline versions give bit-identical rows and slots";
  if (SupportedIsas().size() == 1) {
    std::printf("(no AVX2 or AVX-512 on this CPU: ISA comparison skipped)\n");
    return;
  }
  if (sce::BestVectorIsa() != sce::VectorIsa::kAvx512) {
    std::printf("(no AVX-512 on this CPU: AVX2 compared with the baseline only)\n");
  }
  const float none[1] = {0.0f};
  const float adam[4] = {0.0f, 0.9f, 0.99f, 1e-3f};
  for (int64_t dim : {1, 3, 8, 16, 17, 32, 33, 100}) {
    for (uint32_t seed = 0; seed < 3; ++seed) {
      CheckIsaVersionsAgree<sce::SgdOptimizer>(none, dim, seed);
      CheckIsaVersionsAgree<sce::AdagradOptimizer>(none, dim, seed);
      CheckIsaVersionsAgree<sce::AdamOptimizer>(adam, dim, seed);
      // Row-wise Adagrad averages over the embedding's columns: all of them, or fewer (padding).
      const float row_wise[2] = {1e-8f, static_cast<float>(dim)};
      CheckIsaVersionsAgree<sce::RowWiseAdagradOptimizer>(row_wise, dim, seed);
      const float row_wise_padded[2] = {1e-8f, static_cast<float>((dim + 1) / 2)};
      CheckIsaVersionsAgree<sce::RowWiseAdagradOptimizer>(row_wise_padded, dim, seed);
    }
  }
}

template <typename Optimizer>
bool FusedUpdateMatchesReference(const RandomCsr& csr, const float* hypers, int64_t dim,
                                 uint32_t seed, bool with_bad_rows, size_t bad_stride = 5) {
  const int64_t rows = csr.view.table_rows;
  FloatVec grads(csr.view.input_size * dim);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = std::sin(0.37f * i + seed) * 0.5f;
  std::vector<uint8_t> bad(csr.view.input_size, 0);
  if (with_bad_rows) {
    for (size_t r = 0; r < bad.size(); r += bad_stride) bad[r] = 1;
  }
  const uint8_t* flags = with_bad_rows ? bad.data() : nullptr;
  TableAndSlots<Optimizer> kernel(rows, dim), reference(rows, dim);
  const int64_t kernel_skipped = sce::FusedUpdate<Optimizer>(
      csr.view, sce::GradientRows::InCsrOrder(csr.view, grads.data(), dim), dim, 0.05f, hypers,
      sce::Clip(), kernel.table.data(),
      kernel.slot_pointers, sce::RunSerially, flags, sce::VectorIsa::kBaseline);
  const int64_t reference_skipped = ReferenceFusedUpdate<Optimizer>(
      csr.view, grads.data(), dim, 0.05f, hypers, reference.table.data(),
      std::vector<float*>(reference.slot_pointers.begin(), reference.slot_pointers.end()), flags);
  return kernel_skipped == reference_skipped && kernel.SameBits(reference);
}

// The streamed update sums a shard's rows in blocks (sce::RowSumBlock) and applies the optimizer
// block by block, and a row whose contributions overflow a block's list is carried into the next
// block: neither boundary may change any bit, whatever the width and row count.
void TestFusedUpdateRowSumBlocks() {
  g_test = "fused update: blocks of summed rows and rows cut by a full list give the stable-sort "
           "reference bit for bit";
  const float none[1] = {0.0f};
  const int64_t block_floats = sce::kRowSumBlockBytes / static_cast<int64_t>(sizeof(float));
  CHECK(sce::RowSumBlockRows(32) == block_floats / 32);
  CHECK(sce::RowSumBlockRows(block_floats) == 1);
  CHECK(sce::RowSumBlockRows(block_floats + 1) == 1);  // at least one row
  CHECK(sce::RowSumBlockRows(0) == sce::kListedContributions);  // no more rows than it can list
  // Nine rows per shard: blocks of 3 rows, and of 1 row (width exactly a block, and more).
  for (uint32_t seed = 0; seed < 3; ++seed) {
    RandomCsr csr(seed, 2, 4, 2, 9, 7, true);
    CHECK_OK(sce::ValidateCsrView(csr.view));
    for (int64_t dim : {block_floats / 3, block_floats, block_floats + 1}) {
      for (bool bad_rows : {false, true}) {
        CHECK(FusedUpdateMatchesReference<sce::SgdOptimizer>(csr, none, dim, seed, bad_rows));
        CHECK(FusedUpdateMatchesReference<sce::AdagradOptimizer>(csr, none, dim, seed,
                                                                 bad_rows));
      }
    }
  }
  // Up to 3,000 tokens per shard (about 2,000 referenced): more rows than a block of width 16 or
  // 32 holds (2,048 / 1,024), with the width fixed at compile time and not (33).
  for (uint32_t seed = 0; seed < 2; ++seed) {
    RandomCsr csr(seed, 1, 4, 1, 3000, 2000, true, 1500);
    CHECK_OK(sce::ValidateCsrView(csr.view));
    for (int64_t dim : {16, 32, 33}) {
      for (bool bad_rows : {false, true}) {
        CHECK(FusedUpdateMatchesReference<sce::AdagradOptimizer>(csr, none, dim, seed,
                                                                 bad_rows));
      }
    }
  }
  // 40 tokens per shard and 16 runs of up to 1,500 entries: rows of about 300 contributions, so
  // the list of 4,096 fills up in the middle of rows, several times per shard.
  for (uint32_t seed = 0; seed < 2; ++seed) {
    RandomCsr csr(seed, 2, 4, 2, 40, 2000, true, 1500);
    CHECK_OK(sce::ValidateCsrView(csr.view));
    for (int64_t dim : {8, 32, 33}) {
      for (bool bad_rows : {false, true}) {
        CHECK(FusedUpdateMatchesReference<sce::SgdOptimizer>(csr, none, dim, seed, bad_rows));
        CHECK(FusedUpdateMatchesReference<sce::AdagradOptimizer>(csr, none, dim, seed,
                                                                 bad_rows));
      }
      // Few flagged activation rows, so that a cut row's only one can fall before the cut.
      CHECK(FusedUpdateMatchesReference<sce::AdagradOptimizer>(csr, none, dim, seed, true, 997));
    }
  }
  // Hot rows: one or two tokens per shard, each with thousands of contributions, cut several
  // times (blocks whose only row continues and is cut again); at width block_floats + 1 a block
  // holds one row.
  for (uint32_t seed = 0; seed < 2; ++seed) {
    for (int64_t tokens : {1, 2}) {
      RandomCsr csr(seed, 2, 4, 2, tokens, 7, true, 1500);
      CHECK_OK(sce::ValidateCsrView(csr.view));
      for (int64_t dim : {8, 32}) {
        CHECK(FusedUpdateMatchesReference<sce::AdagradOptimizer>(csr, none, dim, seed, false));
        CHECK(FusedUpdateMatchesReference<sce::AdagradOptimizer>(csr, none, dim, seed, true, 997));
        CHECK(FusedUpdateMatchesReference<sce::SgdOptimizer>(csr, none, dim, seed, true, 13));
      }
      if (seed == 0 && tokens == 1) {  // wide rows cost time: one case
        CHECK(FusedUpdateMatchesReference<sce::AdagradOptimizer>(csr, none, block_floats + 1,
                                                                 seed, true, 997));
      }
    }
  }
}

void TestFusedUpdateMatchesStableSortReference() {
  g_test = "fused update: streamed merge of sorted runs and the collect-and-sort fallback give "
           "the stable-sort reference bit for bit";
  const float none[1] = {0.0f};
  const float adam[4] = {0.0f, 0.9f, 0.99f, 1e-3f};
  // {G, S, M, sorted segments}: 4 and 32 sorted runs (streamed merge), 48 sorted runs and
  // unsorted segments (fallback).
  for (const auto& shape : std::vector<std::array<int64_t, 4>>{
           {1, 4, 1, 1}, {2, 4, 4, 1}, {3, 4, 4, 1}, {1, 4, 2, 0}}) {
    for (uint32_t seed = 0; seed < 4; ++seed) {
      RandomCsr csr(seed, shape[0], shape[1], shape[2], 9, 7, shape[3] == 1);
      CHECK_OK(sce::ValidateCsrView(csr.view));
      for (int64_t dim : {1, 16, 32, 33, 64}) {
        for (bool bad_rows : {false, true}) {
          CHECK(FusedUpdateMatchesReference<sce::SgdOptimizer>(csr, none, dim, seed, bad_rows));
          CHECK(FusedUpdateMatchesReference<sce::AdagradOptimizer>(csr, none, dim, seed,
                                                                   bad_rows));
          CHECK(FusedUpdateMatchesReference<sce::AdamOptimizer>(csr, adam, dim, seed, bad_rows));
          const float row_wise[2] = {1e-8f, static_cast<float>(dim)};
          CHECK(FusedUpdateMatchesReference<sce::RowWiseAdagradOptimizer>(csr, row_wise, dim,
                                                                          seed, bad_rows));
        }
      }
    }
  }
}

void TestRowWiseAdagradFormula() {
  g_test = "row-wise Adagrad: one accumulator per row grows by the mean squared gradient over "
           "the embedding columns, and every column moves by lr / (sqrt(acc) + epsilon)";
  // One shard, one row of width 4 whose embedding is the first 3 columns (the 4th is padding);
  // two samples reference it with gains 1 and 2.
  const int64_t dim = 4;
  std::vector<int32_t> row_pointers = {8}, samples = {0, 1}, tokens = {0, 0};
  std::vector<float> gains = {1.0f, 2.0f};
  for (int i = 0; i < 6; ++i) {
    samples.push_back(sce::kPad);
    tokens.push_back(sce::kPad);
    gains.push_back(static_cast<float>(sce::kPad));
  }
  for (int i = 0; i < 7; ++i) row_pointers.push_back(8);
  sce::CsrView view;
  sce_testing::BindCsrBuffers(row_pointers, samples, tokens, gains, &view);
  view.num_minibatches = 1;
  view.num_sc_per_device = 1;
  view.num_source_replicas = 1;
  view.input_size = 2;
  view.table_rows = 2;
  view.table_name = "t";
  CHECK_OK(sce::ValidateCsrView(view));
  // The padding column gets a gradient too: it must not count in the mean, and it still moves
  // with the row's multiplier (the update treats every column alike).
  const std::vector<float> grads = {0.5f, -1.0f, 2.0f, 5.0f, 0.25f, 0.5f, -1.0f, -1.0f};
  std::vector<float> table = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f};
  std::vector<float> accumulator = {0.1f, 0.1f};
  const float hypers[2] = {1e-3f, 3.0f};
  const float lr = 0.5f;
  std::array<float*, 1> slots = {accumulator.data()};
  sce::FusedUpdate<sce::RowWiseAdagradOptimizer>(
      view, sce::GradientRows::InCsrOrder(view, grads.data(), dim), dim, lr, hypers, sce::Clip(),
      table.data(), slots, sce::RunSerially);
  // Summed gradient: g = 1 * grads[0] + 2 * grads[1] = {1, 0, 0, 3}; the mean runs over the 3
  // embedding columns only: 1/3 (over all 4 it would be 10/4).
  const double acc = 0.1 + (1.0 * 1.0) / 3.0;
  const double multiplier = 0.5 / (std::sqrt(acc) + 1e-3);
  CHECK(std::fabs(accumulator[0] - acc) < 1e-6);
  CHECK(accumulator[1] == 0.1f);  // untouched row
  CHECK(std::fabs(table[0] - (1.0 - multiplier)) < 1e-6);
  CHECK(table[1] == 2.0f && table[2] == 3.0f);
  CHECK(std::fabs(table[3] - (4.0 - 3.0 * multiplier)) < 1e-5);
  for (int i = 4; i < 8; ++i) CHECK(table[i] == static_cast<float>(i + 1));
}

void TestHugePageAdvice() {
  g_test = "huge pages: large buffers are advised once, small ones never, contents unchanged";
  CHECK(sce::BackWithHugePages(nullptr, int64_t{1} << 30) == sce::HugePageAdvice::kTooSmall);
  FloatVec small(1024, 1.0f);
  CHECK(sce::BackWithHugePages(small.data(), 4096) == sce::HugePageAdvice::kTooSmall);
  // 16 MiB: at least 7 whole 2 MiB pages inside wherever malloc put it.
  FloatVec large((size_t{16} << 20) / sizeof(float));
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<float>(i % 1000);
  const int64_t bytes = static_cast<int64_t>(large.size() * sizeof(float));
  const sce::HugePageAdvice first = sce::BackWithHugePages(large.data(), bytes);
#if defined(__linux__)
  CHECK(first == sce::HugePageAdvice::kAdvised || first == sce::HugePageAdvice::kDisabled ||
        first == sce::HugePageAdvice::kUnsupported);
#else
  CHECK(first == sce::HugePageAdvice::kUnsupported || first == sce::HugePageAdvice::kDisabled);
#endif
  if (first == sce::HugePageAdvice::kAdvised) {
    CHECK(sce::BackWithHugePages(large.data(), bytes) == sce::HugePageAdvice::kAlreadyDone);
  }
  bool unchanged = true;
  for (size_t i = 0; i < large.size(); ++i) {
    unchanged = unchanged && large[i] == static_cast<float>(i % 1000);
  }
  CHECK(unchanged);
}

void TestStableSortByKey() {
  g_test = "radix sort: the same permutation as std::stable_sort, for any key range and size";
  uint32_t state = 12345;
  auto next = [&state]() {
    state = state * 1664525u + 1013904223u;
    return state >> 1;
  };
  std::vector<uint32_t> order;
  std::vector<uint64_t> scratch;
  for (int64_t n : {0, 1, 2, 63, 64, 65, 1000, 40000}) {
    for (int64_t max_key : {int64_t{1}, int64_t{7}, int64_t{2047}, int64_t{2048},
                            int64_t{1} << 22, int64_t{18800000}, int64_t{sce::kMaxInt32}}) {
      IntVec keys(n);
      for (auto& k : keys) k = static_cast<int32_t>(next() % (max_key + 1));
      if (n > 2) keys[n / 2] = static_cast<int32_t>(max_key);
      sce::StableSortByKey(keys.data(), n, &order, &scratch);
      std::vector<uint32_t> expected(n);
      for (int64_t i = 0; i < n; ++i) expected[i] = static_cast<uint32_t>(i);
      std::stable_sort(expected.begin(), expected.end(),
                       [&keys](uint32_t a, uint32_t b) { return keys[a] < keys[b]; });
      CHECK(order == expected);
    }
  }
}

// docs/preprocessing.md#coo-conversion: both versions of the prefix sum and of the merge of
// adjacent duplicates against a plain reference, bit for bit (gains compared as bits), on random
// inputs with runs of every length (across the 16-lane blocks too), per-id and single weights,
// and ids out of range.
void TestAdjacentMerge() {
  g_test = "AdjacentMerge docs/preprocessing.md#coo-conversion";
  std::mt19937 rng(7);
  struct Merged {
    IntVec rows, cols;
    std::vector<uint32_t> gain_bits;
    bool bad = false;
    bool operator==(const Merged& o) const {
      return rows == o.rows && cols == o.cols && gain_bits == o.gain_bits && bad == o.bad;
    }
  };
  auto bits = [](const FloatVec& gains, int64_t count) {
    std::vector<uint32_t> out(count);
    if (count > 0) std::memcpy(out.data(), gains.data(), sizeof(float) * count);
    return out;
  };
  using MergeFn = int64_t (*)(const int32_t*, const float*, bool, int64_t, uint32_t, int32_t*,
                              int32_t*, float*, bool*);
  std::vector<MergeFn> versions = {&sce::MergeAdjacentDuplicatesBaseline,
                                   &sce::MergeAdjacentDuplicates};
  std::vector<void (*)(int32_t*, int64_t)> sums = {&sce::PrefixSumInPlaceBaseline,
                                                   &sce::PrefixSumInPlace};
  if (sce::CpuHasAvx512F()) {
    versions.push_back(&sce::MergeAdjacentDuplicatesAvx512);
    sums.push_back(&sce::PrefixSumInPlaceAvx512);
  } else {
    std::fprintf(stderr, "note: no AVX-512 on this CPU; TestAdjacentMerge checks the portable "
                         "versions only\n");
  }
  int mismatches = 0, merged_runs = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = trial < 40 ? trial : static_cast<int64_t>(rng() % 300);
    const int repeat_percent = std::vector<int>{0, 5, 30, 70, 95}[trial % 5];
    const bool per_id = trial % 3 != 0;
    const uint32_t bound = trial % 7 == 0 ? 50 : (uint32_t{1} << 31);
    IntVec samples(n), ids(n);
    FloatVec weights(per_id ? n : 1);
    int32_t sample = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool repeat = i > 0 && static_cast<int>(rng() % 100) < repeat_percent;
      if (!repeat && rng() % 3 == 0) sample += 1 + static_cast<int32_t>(rng() % 2);
      samples[i] = repeat ? samples[i - 1] : sample;
      ids[i] = repeat ? ids[i - 1]
                      : (rng() % 50 == 0 ? -static_cast<int32_t>(rng() % 5) - 1
                                          : static_cast<int32_t>(rng() % 60));
    }
    for (auto& w : weights) w = static_cast<float>(rng() % 1000) / 7.0f - 40.0f;
    if (n == 0 && !per_id) weights.clear();  // read only when n > 0
    // The reference: one entry per run of equal adjacent (sample, id), gains summed in order.
    Merged want;
    IntVec want_rows;
    FloatVec want_gains;
    for (int64_t i = 0; i < n; ++i) {
      const float w = per_id ? weights[i] : weights[0];
      want.bad = want.bad || static_cast<uint32_t>(ids[i]) >= bound;
      if (i > 0 && samples[i] == samples[i - 1] && ids[i] == ids[i - 1]) {
        want_gains.back() += w;
        ++merged_runs;
        continue;
      }
      want.rows.push_back(samples[i]);
      want.cols.push_back(ids[i]);
      want_gains.push_back(w);
    }
    want.gain_bits = bits(want_gains, static_cast<int64_t>(want_gains.size()));
    for (MergeFn merge : versions) {
      Merged got;
      IntVec rows = samples, cols(n);
      FloatVec gains(n);
      const int64_t count = merge(ids.data(), weights.data(), per_id, n, bound, rows.data(),
                                  cols.data(), gains.data(), &got.bad);
      rows.resize(count);
      cols.resize(count);
      got.rows = rows;
      got.cols = cols;
      got.gain_bits = bits(gains, count);
      if (!(got == want)) ++mismatches;
    }
    // Prefix sums of small increments (the ragged form's per-id sample increments).
    IntVec increments(n);
    for (auto& x : increments) x = static_cast<int32_t>(rng() % 3);
    IntVec want_sums = increments;
    for (int64_t i = 1; i < n; ++i) want_sums[i] += want_sums[i - 1];
    for (auto sum : sums) {
      IntVec got = increments;
      sum(got.data(), n);
      if (got != want_sums) ++mismatches;
    }
  }
  CHECK_EQ(mismatches, 0);
  CHECK(merged_runs > 1000);  // the inputs did exercise merging
}

void TestStableSortWords() {
  g_test = "radix sort of words: stable by the key bits, for keys of 1 to 64 bits (1 to 6 passes)";
  uint64_t state = 99;
  auto next = [&state]() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state;
  };
  for (int64_t n : {2, 63, 64, 5000}) {
    for (int bits : {1, 12, 13, 24, 25, 36, 37, 48, 49, 60, 64}) {
      for (int shift : {0, 64 - bits}) {
        const uint64_t mask = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
        std::vector<uint64_t> words(n), buffer(n);
        // Few distinct keys, so that stability is tested: the low 8 bits of each key vary, the
        // others are the same for half of the words.
        for (auto& w : words) {
          const uint64_t key = (next() & 1 ? next() : uint64_t{0xff} << 8 | (next() & 0xff)) & mask;
          const uint64_t other = next() & ~(mask << shift);
          w = (key << shift) | other;
        }
        std::vector<uint64_t> expected = words;
        std::stable_sort(expected.begin(), expected.end(), [&](uint64_t a, uint64_t b) {
          return ((a >> shift) & mask) < ((b >> shift) & mask);
        });
        const uint64_t* sorted = sce::StableSortWords(words.data(), buffer.data(), n, shift, bits);
        CHECK(std::equal(expected.begin(), expected.end(), sorted));
      }
    }
  }
}

// Ragged inputs of one stacked table's features, kept alive for the StackedFeatures that view them.
struct StackedInputs {
  std::vector<IntVec> splits, values;
  std::vector<FloatVec> weights;
  std::vector<sce::StackedFeature> features;
};

// `samples[f]` samples of feature f, every `every`-th with 0-4 ids below vocab[f] (the others
// empty), features placed one after another in the stacked batch (S SparseCores) and the stacked
// vocabulary (64 rows apart).
StackedInputs RandomStackedFeatures(const std::vector<int64_t>& samples, const IntVec& vocab,
                                    const std::vector<sce::Combiner>& combiners, int64_t sc,
                                    int64_t shards, uint64_t seed, int64_t every = 1) {
  std::mt19937_64 rng(seed);
  StackedInputs in;
  const size_t n = samples.size();
  in.splits.resize(n);
  in.values.resize(n);
  in.weights.resize(n);
  in.features.resize(n);
  int64_t offset = 0, total = 0;
  for (int64_t s : samples) total += s;
  for (size_t f = 0; f < n; ++f) {
    in.splits[f] = {0};
    for (int64_t r = 0; r < samples[f]; ++r) {
      const int count = r % every == 0 ? static_cast<int>(rng() % 5) : 0;
      for (int k = 0; k < count; ++k) {
        // Few distinct ids, so that samples repeat ids (adjacent and not).
        in.values[f].push_back(static_cast<int32_t>(rng() % std::min<uint64_t>(vocab[f], 6)));
        in.weights[f].push_back(0.25f * static_cast<float>(1 + rng() % 8));
      }
      in.splits[f].push_back(static_cast<int32_t>(in.values[f].size()));
    }
    sce::StackedFeature& x = in.features[f];
    x.input.index_data = in.splits[f].data();
    x.input.index_dim0 = static_cast<int64_t>(in.splits[f].size());
    x.input.values = in.values[f].data();
    x.input.num_values = static_cast<int64_t>(in.values[f].size());
    x.input.weights = in.weights[f].data();
    x.input.weights_rank = 1;
    x.input.num_weights = static_cast<int64_t>(in.weights[f].size());
    x.sample_count = samples[f];
    x.combiner = combiners[f];
    x.vocabulary_size = vocab[f];
    x.transform.num_sc_per_chip = sc;
    x.transform.row_offset = offset;
    x.transform.col_offset = 64 * static_cast<int64_t>(f);
    x.transform.col_shift = static_cast<int64_t>(f);
    x.transform.num_sc_shards = shards;
    x.transform.stacked_table_sample_count = total;
    x.context = sce::Context{"t" + std::to_string(f), "f" + std::to_string(f)};
    offset += samples[f];
  }
  return in;
}

// WriteStackedCoo followed by GetMinibatchSplits: what GetStackedMinibatchSplits must equal.
sce::Status TwoStepSplits(const std::vector<sce::StackedFeature>& features,
                          const sce::MinibatchSplitsParams& params, sce::MinibatchSplits* out) {
  sce::StackedCooParts parts;
  SCE_RETURN_IF_ERROR(sce::ConvertFeaturesToStackedCoo(features, sce::RunSerially, &parts));
  IntVec rows(parts.total), cols(parts.total);
  FloatVec gains(parts.total);
  SCE_RETURN_IF_ERROR(sce::WriteStackedCoo(features, parts, rows.data(), cols.data(),
                                           gains.data(), sce::RunSerially));
  return sce::GetMinibatchSplits(rows.data(), cols.data(), gains.data(), parts.total,
                                 parts.total, parts.total, params, out);
}

void CheckSameSplits(const sce::MinibatchSplits& got, const sce::MinibatchSplits& want) {
  CHECK_EQ(got.rows, want.rows);
  CHECK_EQ(got.cols, want.cols);
  CHECK_EQ(got.gains, want.gains);
  CHECK(got.id_counts == want.id_counts);
  CHECK_EQ(got.splits, want.splits);
  CHECK_EQ(got.max_ids, want.max_ids);
  CHECK_EQ(got.max_uniques, want.max_uniques);
}

void TestStackedMinibatchSplits() {
  g_test = "GetStackedMinibatchSplits equals WriteStackedCoo + GetMinibatchSplits";
  const std::vector<sce::Combiner> combiners = {sce::Combiner::kSum, sce::Combiner::kMean,
                                                sce::Combiner::kSqrtn};
  int compared = 0;
  for (int64_t sc : {1, 2, 4}) {
    for (int64_t replicas : {1, 2}) {
      for (int64_t limit : {3, 1000}) {
        for (uint64_t seed = 1; seed <= 3; ++seed) {
          StackedInputs in = RandomStackedFeatures({8 * sc, 4 * sc, 12 * sc}, {50, 7, 64},
                                                   combiners, sc, sc * replicas, seed);
          sce::MinibatchSplitsParams p = SplitsParams("stacked", 24 * sc, sc, 3 * 64, limit);
          p.num_replica = replicas;
          p.max_division_level = 3;
          sce::MinibatchSplits fused, two_step;
          const sce::Status want = TwoStepSplits(in.features, p, &two_step);
          const sce::Status got = sce::GetStackedMinibatchSplits(in.features, p, &fused);
          CHECK_EQ(got.ok(), want.ok());
          if (got.ok() && want.ok()) {
            CheckSameSplits(fused, two_step);
            ++compared;
          }
          // In parallel (the thread pool's ranges) the result is the same.
          sce::MinibatchSplits parallel;
          const sce::ParallelFor one_at_a_time = [](int64_t n, int64_t, const sce::RangeFn& w) {
            for (int64_t i = 0; i < n; ++i) w(i, i + 1);
          };
          CHECK_EQ(sce::GetStackedMinibatchSplits(in.features, p, &parallel, one_at_a_time).ok(),
                   want.ok());
          if (want.ok()) CheckSameSplits(parallel, two_step);
        }
      }
    }
  }
  CHECK(compared >= 18);  // the limit of 1000 always fits

  g_test = "GetStackedMinibatchSplits: words without rows (31-bit keys, 2^20 rows, 2^14 ids)";
  {
    // Every 32nd of 2^20 samples has ids: about 2^15 ids, so 31 key + 21 row + 15 position bits
    // exceed a word here, while the two steps bound the key by the largest col (7 bits).
    StackedInputs in = RandomStackedFeatures({1 << 20, 4}, {50, 7},
                                             {sce::Combiner::kSum, sce::Combiner::kMean}, 1, 1, 7,
                                             32);
    // The vocabulary is the key bound of the one-call path: 31 bits.
    const sce::MinibatchSplitsParams p =
        SplitsParams("stacked", (1 << 20) + 4, 1, int64_t{1} << 31, 1 << 30);
    sce::MinibatchSplits fused, two_step;
    CHECK_OK(TwoStepSplits(in.features, p, &two_step));
    CHECK_OK(sce::GetStackedMinibatchSplits(in.features, p, &fused));
    CheckSameSplits(fused, two_step);
  }

  g_test = "GetStackedMinibatchSplits: errors name the table and feature, nothing is written";
  StackedInputs in = RandomStackedFeatures({8, 8}, {50, 7},
                                           {sce::Combiner::kSum, sce::Combiner::kSum}, 4, 4, 11);
  sce::MinibatchSplitsParams p = SplitsParams("stacked", 16, 4, 128, 1000);
  bool allocated = false;
  const sce::SplitIdAllocator never = [&](int64_t, sce::SplitIdBuffers*) {
    allocated = true;
    return sce::FailedPrecondition("must not be reached");
  };
  sce::MinibatchSplits out;
  {
    StackedInputs bad = in;
    bad.values[1][0] = 7;  // feature f1's vocabulary is 7
    for (size_t f = 0; f < 2; ++f) {
      bad.features[f].input.values = bad.values[f].data();
      bad.features[f].input.index_data = bad.splits[f].data();
      bad.features[f].input.weights = bad.weights[f].data();
    }
    CHECK_ERROR(sce::GetStackedMinibatchSplits(bad.features, p, &out, sce::RunSerially, never),
                "table 't1', feature 'f1': id 7");
  }
  {
    sce::MinibatchSplitsParams small = p;
    small.table_vocab_size = 64;  // feature f1's stacked cols are 64 + id
    CHECK_ERROR(sce::GetStackedMinibatchSplits(in.features, small, &out, sce::RunSerially, never),
                "feature 'f1': id");
    CHECK_ERROR(TwoStepSplits(in.features, small, &out), "out of range");
  }
  {
    sce::MinibatchSplitsParams other = p;
    other.sample_count = 32;
    CHECK_ERROR(sce::GetStackedMinibatchSplits(in.features, other, &out, sce::RunSerially, never),
                "stacked_table_sample_count (16)");
  }
  {
    // One id per sample in both features, and feature f1 placed on feature f0's rows: on every
    // SparseCore its rows 0, 1 follow f0's rows 0, 1, so the stacked rows are not sorted.
    StackedInputs overlapping = in;
    for (size_t f = 0; f < 2; ++f) {
      overlapping.splits[f] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
      overlapping.values[f] = {0, 1, 2, 3, 4, 5, 6, 0};
      overlapping.weights[f] = FloatVec(8, 1.0f);
      sce::IdInput& x = overlapping.features[f].input;
      x.index_data = overlapping.splits[f].data();
      x.values = overlapping.values[f].data();
      x.weights = overlapping.weights[f].data();
      x.num_values = x.num_weights = 8;
    }
    overlapping.features[1].transform.row_offset = 0;
    CHECK_ERROR(sce::GetStackedMinibatchSplits(overlapping.features, p, &out, sce::RunSerially,
                                               never),
                "feature 'f1': on sparse core 0");
    CHECK_ERROR(TwoStepSplits(overlapping.features, p, &out), "must be sorted");
  }
  {
    sce::MinibatchSplitsParams tight = p;
    tight.max_ids_per_partition = 1;
    tight.max_unique_ids_per_partition = 1;
    tight.max_division_level = 0;
    CHECK_ERROR(sce::GetStackedMinibatchSplits(in.features, tight, &out, sce::RunSerially, never),
                "too many ids");
  }
  CHECK(!allocated);
  sce::MinibatchSplits after, two_step;
  CHECK_OK(sce::GetStackedMinibatchSplits(in.features, p, &after));
  CHECK_OK(TwoStepSplits(in.features, p, &two_step));
  CheckSameSplits(after, two_step);
}

// The lookup tests' cases: for 1 and 2 source replicas (G) and five seeds, a validated random CSR
// (4 SparseCores, 2 minibatches, 9 rows per shard, 7 samples per SparseCore) and a table of width
// kLookupTestDim whose values depend on the seed; fn(csr, table, G) checks one case.
constexpr int64_t kLookupTestDim = 5;
template <typename Fn>
void ForEachLookupCase(Fn fn) {
  for (int64_t G : {1, 2}) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      RandomCsr csr(seed, G, 4, 2, 9, 7);
      CHECK_OK(sce::ValidateCsrView(csr.view));
      FloatVec table(csr.view.table_rows * kLookupTestDim);
      for (size_t i = 0; i < table.size(); ++i) table[i] = std::cos(0.3f * i + seed);
      fn(csr, table, G);
    }
  }
}

// The forward lookup by its definition: zeros, then every valid entry's gain-weighted table row
// added to its sample's row in buffer order (SparseCore-major rows). Marks the rows reached.
FloatVec LookupReference(const RandomCsr& csr, const FloatVec& table, int64_t dim,
                         std::vector<bool>* reached) {
  FloatVec expected(csr.view.input_size * dim, 0.0f);
  reached->assign(csr.view.input_size, false);
  const int64_t samples_per_sc = csr.view.samples_per_sc();
  for (int64_t sc = 0; sc < csr.view.num_source_sparse_cores(); ++sc) {
    for (int64_t b = 0; b < csr.view.num_minibatches; ++b) {
      for (int64_t p = 0; p < csr.view.num_shards(); ++p) {
        int64_t begin, end;
        csr.view.Segment(sc, b, p, &begin, &end);
        for (int64_t i = begin; i < end; ++i) {
          if (csr.tokens[i] == sce::kPad || csr.samples[i] == sce::kPad) continue;
          const float* row = &table[(p * csr.view.rows_per_shard() + csr.tokens[i]) * dim];
          float* out = &expected[(sc * samples_per_sc + csr.samples[i]) * dim];
          for (int64_t j = 0; j < dim; ++j) out[j] += csr.gains[i] * row[j];
          (*reached)[sc * samples_per_sc + csr.samples[i]] = true;
        }
      }
    }
  }
  return expected;
}

void TestLookupOverwritesActivations() {
  g_test = "lookup: every activation row is overwritten; rows without entries are +0";
  int64_t rows_with_entries = 0, all_rows = 0;
  ForEachLookupCase([&](const RandomCsr& csr, FloatVec& table, int64_t /*G*/) {
    const int64_t dim = kLookupTestDim;
    // Row 0 holds negative zeros: 0 + gain * (-0) is +0, as when the block starts zero-filled.
    std::fill(table.begin(), table.begin() + dim, -0.0f);
    std::vector<bool> reached;
    const FloatVec expected = LookupReference(csr, table, dim, &reached);
    rows_with_entries += std::count(reached.begin(), reached.end(), true);
    all_rows += csr.view.input_size;
    const sce::FeatureRowsPerSc features = {3, 0, 4};
    sce::Quantization q;
    q.low = -0.5f;
    q.high = 0.5f;
    q.num_buckets = 5;
    for (const sce::Quantization& quantization : {sce::Quantization(), q}) {
      for (const sce::FeatureRowsPerSc& order : {sce::FeatureRowsPerSc(), features}) {
        for (sce::LookupLoop loop : {sce::LookupLoop::kAuto, sce::LookupLoop::kInBufferOrder}) {
          // Stale contents (NaN) and a zero-filled buffer give the same bits.
          FloatVec stale(expected.size(), std::nanf("")), zeroed(expected.size(), 0.0f);
          sce::SparseDenseMatmul(csr.view, table.data(), dim, quantization, stale.data(),
                                 sce::RunSerially, order, sce::BestVectorIsa(), loop);
          sce::SparseDenseMatmul(csr.view, table.data(), dim, quantization, zeroed.data(),
                                 sce::RunSerially, order, sce::BestVectorIsa(), loop);
          CHECK(std::memcmp(stale.data(), zeroed.data(), stale.size() * sizeof(float)) == 0);
          if (quantization.enabled() || !order.empty()) continue;
          CHECK(std::memcmp(stale.data(), expected.data(), stale.size() * sizeof(float)) == 0);
        }
      }
    }
  });
  CHECK(0 < rows_with_entries && rows_with_entries < all_rows);  // both kinds of rows occur
}

void TestLookupIsaVersionsAgree() {
  g_test = "lookup: every instruction set, row width and loop (by sample or in buffer order) "
           "gives the reference's bits";
  // 16, 32 and 64 have builds with the width fixed at compile time; the others take the loop
  // over a width read at run time. Segments of up to 60 entries also reach both loops' prefetch
  // (48 entries ahead within a segment in buffer order, 32 ahead in sample-major order).
  const int64_t G = 2, S = 4, samples_per_sc = 7;
  const sce::FeatureRowsPerSc features = {3, 0, 4};
  for (int64_t dim : {1, 5, 16, 17, 32, 48, 64, 100}) {
    for (uint32_t seed = 0; seed < 3; ++seed) {
      RandomCsr csr(seed, G, S, 2, 9, samples_per_sc, /*sorted_segments=*/true,
                    /*max_entries=*/60);
      CHECK_OK(sce::ValidateCsrView(csr.view));
      FloatVec table(csr.view.table_rows * dim);
      for (size_t i = 0; i < table.size(); ++i) table[i] = std::cos(0.3f * i + seed);
      std::vector<bool> reached;
      const FloatVec expected = LookupReference(csr, table, dim, &reached);
      // Feature-major: sample j of feature f (local row offset_f + j) of source SparseCore
      // sc = g * S + s lands at row g * S * samples_per_sc + S * offset_f + s * rows_f + j.
      FloatVec expected_feature_major(expected.size(), std::nanf(""));
      for (int64_t sc = 0; sc < G * S; ++sc) {
        const int64_t g = sc / S, s = sc % S;
        int64_t offset = 0;
        for (int64_t rows_f : features) {
          for (int64_t j = 0; j < rows_f; ++j) {
            const int64_t from = sc * samples_per_sc + offset + j;
            const int64_t to = g * S * samples_per_sc + S * offset + s * rows_f + j;
            std::memcpy(&expected_feature_major[to * dim], &expected[from * dim],
                        dim * sizeof(float));
          }
          offset += rows_f;
        }
      }
      for (sce::VectorIsa isa : SupportedIsas()) {
        for (sce::LookupLoop loop : {sce::LookupLoop::kAuto, sce::LookupLoop::kInBufferOrder}) {
          FloatVec sc_major(expected.size(), std::nanf("")), feature_major(sc_major);
          sce::SparseDenseMatmul(csr.view, table.data(), dim, sce::Quantization(),
                                 sc_major.data(), sce::RunSerially, {}, isa, loop);
          sce::SparseDenseMatmul(csr.view, table.data(), dim, sce::Quantization(),
                                 feature_major.data(), sce::RunSerially, features, isa, loop);
          CHECK(std::memcmp(sc_major.data(), expected.data(), expected.size() * 4) == 0);
          CHECK(std::memcmp(feature_major.data(), expected_feature_major.data(),
                            expected.size() * 4) == 0);
        }
      }
    }
  }
  // An instruction set the CPU lacks, or no instruction set at all, runs as UsableIsa says.
  CHECK(sce::UsableIsa(sce::VectorIsa::kAvx512) == sce::BestVectorIsa());
  CHECK(sce::UsableIsa(static_cast<sce::VectorIsa>(7)) == sce::VectorIsa::kBaseline);
  CHECK(sce::UsableIsa(sce::VectorIsa::kBaseline) == sce::VectorIsa::kBaseline);
}

void TestSampleMajorOrder() {
  g_test = "sample-major order: each sample's valid entries of its shards, in visiting order; the "
           "lookup over some local shards gives the same bits by sample and in buffer order";
  sce::SampleMajorOrder order;  // one object for every case: its buffers are reused
  for (uint32_t seed = 0; seed < 6; ++seed) {
    // Larger and smaller batches alternate, so a build after a larger one reuses its memory.
    const int64_t samples_per_sc = seed % 2 ? 3 : 11, R = 9, S = 4;
    RandomCsr csr(seed, 2, S, 2, R, samples_per_sc);
    // This replica holds shards 1 and 2 of 4: the table given has their 2 * R rows.
    csr.view.first_local_shard = 1;
    csr.view.num_local_shards = 2;
    csr.view.table_rows = 2 * R;
    CHECK_OK(sce::ValidateCsrView(csr.view));
    CHECK(sce::SampleMajorOrder::Fits(csr.view));
    for (int64_t sc = 0; sc < csr.view.num_source_sparse_cores(); ++sc) {
      std::vector<std::vector<std::pair<uint32_t, float>>> expected(samples_per_sc);
      for (int64_t b = 0; b < csr.view.num_minibatches; ++b) {
        for (int64_t p = 0; p < 2; ++p) {
          int64_t begin, end;
          csr.view.Segment(sc, b, 1 + p, &begin, &end);
          for (int64_t i = begin; i < end; ++i) {
            if (csr.tokens[i] == sce::kPad || csr.samples[i] == sce::kPad) continue;
            expected[csr.samples[i]].push_back(
                {static_cast<uint32_t>(p * R + csr.tokens[i]), csr.gains[i]});
          }
        }
      }
      CHECK(order.Build(csr.view, sc));
      const sce::SampleMajorEntries entries = order.entries();
      CHECK(entries.sample_begin[0] == 0);
      for (int64_t i = 0; i < samples_per_sc; ++i) {
        const int64_t first = entries.sample_begin[i];
        CHECK(entries.sample_begin[i + 1] - first == static_cast<int64_t>(expected[i].size()));
        for (size_t k = 0; k < expected[i].size(); ++k) {
          CHECK(entries.rows[first + k] == expected[i][k].first);
          CHECK(entries.gains[first + k] == expected[i][k].second);
        }
      }
    }
    const int64_t dim = 16;
    FloatVec table(csr.view.table_rows * dim);
    for (size_t i = 0; i < table.size(); ++i) table[i] = std::sin(0.7f * i + seed);
    // SparseCore-major and feature-major activation rows.
    const sce::FeatureRowsPerSc features =
        samples_per_sc == 3 ? sce::FeatureRowsPerSc{1, 0, 2} : sce::FeatureRowsPerSc{3, 0, 8};
    for (const sce::FeatureRowsPerSc& rows : {sce::FeatureRowsPerSc(), features}) {
      FloatVec by_sample(csr.view.input_size * dim, std::nanf("")), in_buffer_order(by_sample);
      sce::SparseDenseMatmul(csr.view, table.data(), dim, sce::Quantization(), by_sample.data(),
                             sce::RunSerially, rows, sce::BestVectorIsa(), sce::LookupLoop::kAuto);
      sce::SparseDenseMatmul(csr.view, table.data(), dim, sce::Quantization(),
                             in_buffer_order.data(), sce::RunSerially, rows, sce::BestVectorIsa(),
                             sce::LookupLoop::kInBufferOrder);
      CHECK(std::memcmp(by_sample.data(), in_buffer_order.data(), by_sample.size() * 4) == 0);
      // bfloat16 rows at the widths of their hand-written AVX-512 loop, in every instruction set.
      for (int64_t narrow_dim : {32, 64}) {
        std::vector<sce::Bfloat16> narrow(csr.view.table_rows * narrow_dim);
        for (size_t i = 0; i < narrow.size(); ++i) {
          narrow[i].bits = sce::FloatToBfloat16Nearest(std::sin(0.3f * i + seed) * 2.0f);
        }
        for (sce::VectorIsa isa : SupportedIsas()) {
          FloatVec narrow_by_sample(csr.view.input_size * narrow_dim, std::nanf("")),
              narrow_in_order(narrow_by_sample);
          sce::SparseDenseMatmul(csr.view, narrow.data(), narrow_dim, sce::Quantization(),
                                 narrow_by_sample.data(), sce::RunSerially, rows, isa,
                                 sce::LookupLoop::kAuto);
          sce::SparseDenseMatmul(csr.view, narrow.data(), narrow_dim, sce::Quantization(),
                                 narrow_in_order.data(), sce::RunSerially, rows, isa,
                                 sce::LookupLoop::kInBufferOrder);
          CHECK(std::memcmp(narrow_by_sample.data(), narrow_in_order.data(),
                            narrow_by_sample.size() * 4) == 0);
        }
      }
    }
  }
  // A table beyond the 32-bit row index is left to the loop in buffer order.
  sce::CsrView huge;
  huge.table_rows = int64_t{1} << 32;
  CHECK(!sce::SampleMajorOrder::Fits(huge));
  huge.table_rows -= 1;
  CHECK(sce::SampleMajorOrder::Fits(huge));
}

// A parallel_for that runs the ranges [0, 1), [1, 3), [3, 6), ... in reverse order, so the
// grouping's and the grouped lookup's results cannot depend on one range running first.
void RunInUnevenRangesBackwards(int64_t n, int64_t, const sce::RangeFn& work) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t begin = 0, size = 1; begin < n; begin += size, ++size) {
    ranges.push_back({begin, std::min(n, begin + size)});
  }
  for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) work(it->first, it->second);
}

// The grouping of `view` by activation row (CountEntriesPerActivationRow, then
// PlaceEntriesByActivationRow), as owned buffers.
struct Grouping {
  std::vector<int32_t> row_begin, rows;
  FloatVec gains;
  Grouping(const sce::CsrView& view, const sce::FeatureRowsPerSc& features,
           const sce::ParallelFor& parallel_for) {
    row_begin.assign(view.input_size + 1, -7);  // every slot must be written
    int64_t total = -1;
    CHECK_OK(sce::CountEntriesPerActivationRow(view, features, row_begin.data(), &total,
                                               parallel_for));
    CHECK(total == row_begin.back());
    std::vector<int32_t> cursor(row_begin.begin(), row_begin.end() - 1);
    rows.assign(total, -1);
    gains.assign(total, std::nanf(""));
    sce::PlaceEntriesByActivationRow(view, features, cursor.data(), rows.data(), gains.data(),
                                     parallel_for);
    for (int64_t a = 0; a < view.input_size; ++a) CHECK(cursor[a] == row_begin[a + 1]);
  }
  sce::GroupedEntries View() const {
    return {row_begin.data(), static_cast<int64_t>(row_begin.size()), rows.data(),
            static_cast<int64_t>(rows.size()), gains.data(), static_cast<int64_t>(gains.size())};
  }
};

void TestGroupedEntries() {
  g_test = "grouped entries: each activation row's valid entries in visiting order, for CSR and "
           "feature-major rows, local shards and several source replicas; the grouped lookup "
           "gives SparseDenseMatmul's bits for every row type and instruction set";
  for (uint32_t seed = 0; seed < 8; ++seed) {
    const int64_t samples_per_sc = seed % 2 ? 3 : 11, R = 9, S = 4, G = seed % 3 == 2 ? 2 : 1;
    RandomCsr csr(seed, G, S, 2, R, samples_per_sc);
    if (seed % 4 == 1) {  // this replica holds shards 1 and 2 of 4
      csr.view.first_local_shard = 1;
      csr.view.num_local_shards = 2;
      csr.view.table_rows = 2 * R;
    }
    CHECK_OK(sce::ValidateCsrView(csr.view));
    CHECK_OK(sce::CheckGroupable(csr.view));
    const sce::FeatureRowsPerSc features =
        samples_per_sc == 3 ? sce::FeatureRowsPerSc{1, 0, 2} : sce::FeatureRowsPerSc{3, 0, 8};
    for (const sce::FeatureRowsPerSc& order : {sce::FeatureRowsPerSc(), features}) {
      CHECK_OK(sce::ValidateFeatureRows(order, csr.view));
      // The expected grouping, from the buffers directly.
      const sce::FeatureMajorRows fm =
          order.empty() ? sce::FeatureMajorRows() : sce::MakeFeatureMajorRows(csr.view, order);
      std::vector<std::vector<std::pair<int32_t, float>>> expected(csr.view.input_size);
      for (int64_t sc = 0; sc < csr.view.num_source_sparse_cores(); ++sc) {
        for (int64_t b = 0; b < csr.view.num_minibatches; ++b) {
          for (int64_t p = 0; p < csr.view.local_shards(); ++p) {
            int64_t begin, end;
            csr.view.Segment(sc, b, csr.view.first_local_shard + p, &begin, &end);
            for (int64_t i = begin; i < end; ++i) {
              if (csr.tokens[i] == sce::kPad || csr.samples[i] == sce::kPad) continue;
              const int64_t natural = sc * samples_per_sc + csr.samples[i];
              const int64_t a = order.empty() ? natural : fm.out_row[natural];
              expected[a].push_back({static_cast<int32_t>(p * R + csr.tokens[i]), csr.gains[i]});
            }
          }
        }
      }
      const Grouping grouping(csr.view, order, RunInUnevenRangesBackwards);
      CHECK(grouping.row_begin[0] == 0);
      for (int64_t a = 0; a < csr.view.input_size; ++a) {
        const int64_t first = grouping.row_begin[a];
        CHECK(grouping.row_begin[a + 1] - first == static_cast<int64_t>(expected[a].size()));
        for (size_t k = 0; k < expected[a].size(); ++k) {
          CHECK(grouping.rows[first + k] == expected[a][k].first);
          CHECK(grouping.gains[first + k] == expected[a][k].second);
        }
      }
      CHECK_OK(sce::ValidateGroupedEntries(grouping.View(), csr.view.table_rows, "t"));
      for (int64_t dim : {1, 16, 32, 64, 7}) {
        FloatVec table(csr.view.table_rows * dim);
        for (size_t i = 0; i < table.size(); ++i) table[i] = std::sin(0.7f * i + seed);
        std::vector<sce::Bfloat16> narrow(table.size());
        std::vector<sce::Float16> half(table.size());
        bool overflow = false;
        for (size_t i = 0; i < table.size(); ++i) {
          narrow[i].bits = sce::FloatToBfloat16Nearest(table[i] * 2.0f);
          half[i].bits = sce::FloatToFloat16Nearest(table[i] * 2.0f, &overflow);
        }
        CHECK(!overflow);
        for (sce::VectorIsa isa : SupportedIsas()) {
          const auto same_bits = [&](const auto* rows) {
            FloatVec grouped(csr.view.input_size * dim, std::nanf("")), direct(grouped);
            sce::SparseDenseMatmulGrouped(grouping.View(), rows, dim, grouped.data(),
                                          RunInUnevenRangesBackwards, isa);
            sce::SparseDenseMatmul(csr.view, rows, dim, sce::Quantization(), direct.data(),
                                   sce::RunSerially, order, isa, sce::LookupLoop::kInBufferOrder);
            CHECK(std::memcmp(grouped.data(), direct.data(), grouped.size() * 4) == 0);
          };
          same_bits(table.data());
          same_bits(narrow.data());
          same_bits(half.data());
        }
      }
    }
  }
  // A table beyond the int32 row index cannot be grouped.
  sce::CsrView huge;
  huge.table_name = "huge";
  huge.table_rows = sce::kMaxInt32 + 1;
  CHECK_ERROR(sce::CheckGroupable(huge), "table 'huge'");
  huge.table_rows = sce::kMaxInt32;
  CHECK_OK(sce::CheckGroupable(huge));
  // No activation rows: an empty grouping, and a lookup that writes nothing.
  const std::vector<int32_t> zero = {0};
  const sce::GroupedEntries empty{zero.data(), 1, nullptr, 0, nullptr, 0};
  CHECK_OK(sce::ValidateGroupedEntries(empty, 5, "t"));
  sce::SparseDenseMatmulGrouped(empty, static_cast<const float*>(nullptr), 4, nullptr,
                                sce::RunSerially);
}

void TestGroupedEntriesValidation() {
  g_test = "grouped entries from outside: every malformed offset, count or row is InvalidArgument "
           "naming the table";
  const std::vector<int32_t> rows = {0, 4, 2};
  const FloatVec gains = {1, 2, 3};
  const auto check = [&](std::vector<int32_t> row_begin, int64_t num_rows, int64_t num_gains,
                         int64_t table_rows, const char* message) {
    const sce::GroupedEntries e{row_begin.data(), static_cast<int64_t>(row_begin.size()),
                                rows.data(), num_rows, gains.data(), num_gains};
    const sce::Status status = sce::ValidateGroupedEntries(e, table_rows, "video");
    if (message == nullptr) {
      CHECK_OK(status);
    } else {
      CHECK_ERROR(status, "table 'video'");
      CHECK_ERROR(status, message);
    }
  };
  check({0, 1, 3}, 3, 3, 5, nullptr);
  check({0, 3, 3}, 3, 3, 5, nullptr);
  check({}, 0, 0, 5, "at least one entry");
  check({1, 3}, 3, 3, 5, "activation_row_begin[0] must be 0");
  check({0, 2, 1, 3}, 3, 3, 5, "decreases at 2");
  check({0, 1, 3}, 2, 3, 5, "entry_rows has 2");
  check({0, 1, 3}, 3, 2, 5, "entry_gains 2");
  check({0, 1, 2}, 3, 3, 5, "ends at 2 entries");
  check({0, 1, 3}, 3, 3, 4, "entry_rows[1] = 4 is outside the table's 4 rows");
  const std::vector<int32_t> negative_rows = {0, -1}, row_begin = {0, 2};
  CHECK_ERROR(sce::ValidateGroupedEntries({row_begin.data(), 2, negative_rows.data(), 2,
                                           gains.data(), 2}, 5, "video"),
              "entry_rows[1] = -1");
  // The checks are vectorized reductions: a culprit anywhere in a long grouping, including the
  // tail a vector loop leaves over, is found and named; a table of more rows than int32 holds
  // takes every non-negative row.
  const int64_t n = 1000;
  std::vector<int32_t> long_begin(n + 1), long_rows(n, 7);
  const FloatVec long_gains(n, 1.0f);
  for (int64_t a = 0; a <= n; ++a) long_begin[a] = static_cast<int32_t>(a);
  const auto long_check = [&](int64_t table_rows) {
    return sce::ValidateGroupedEntries({long_begin.data(), n + 1, long_rows.data(), n,
                                        long_gains.data(), n}, table_rows, "video");
  };
  CHECK_OK(long_check(8));
  for (int64_t at : {int64_t{0}, int64_t{517}, n - 1}) {
    for (int32_t bad : {8, -1, std::numeric_limits<int32_t>::min()}) {
      long_rows[at] = bad;
      CHECK_ERROR(long_check(8), "entry_rows[" + std::to_string(at) + "] = " +
                                     std::to_string(bad) + " is outside");
      long_rows[at] = 7;
    }
    if (at > 0) {
      long_begin[at] = static_cast<int32_t>(at - 2);
      CHECK_ERROR(long_check(8), "decreases at " + std::to_string(at));
      long_begin[at] = static_cast<int32_t>(at);
    }
  }
  long_rows[n - 1] = std::numeric_limits<int32_t>::max();
  CHECK_OK(long_check(int64_t{1} << 40));
  CHECK_ERROR(long_check(std::numeric_limits<int32_t>::max()), "is outside");
}

void TestLookupOf16BitRows() {
  g_test = "lookup: bfloat16 and float16 rows give the activations of their float32 values, bit "
           "for bit, in every instruction set and at every width build";
  for (int64_t dim : {16, 32, 64, 5}) {  // 32 and 64: bfloat16's hand-written AVX-512 loop
    for (uint32_t seed = 0; seed < 3; ++seed) {
      RandomCsr csr(seed, 2, 4, 2, 9, 7);
      CHECK_OK(sce::ValidateCsrView(csr.view));
      const size_t n = static_cast<size_t>(csr.view.table_rows * dim);
      std::vector<sce::Bfloat16> bf16(n);
      std::vector<sce::Float16> f16(n);
      FloatVec bf16_values(n), f16_values(n);
      for (size_t i = 0; i < n; ++i) {
        const float value = std::cos(0.3f * i + seed) * 3.0f;
        bool overflow = false;
        bf16[i].bits = sce::FloatToBfloat16Nearest(value);
        f16[i].bits = sce::FloatToFloat16Nearest(value, &overflow);
        bf16_values[i] = sce::Bfloat16ToFloat(bf16[i].bits);
        f16_values[i] = sce::Float16ToFloat(f16[i].bits);
      }
      for (sce::VectorIsa isa : SupportedIsas()) {
        const size_t out = static_cast<size_t>(csr.view.input_size * dim);
        FloatVec expected(out), got(out);
        sce::SparseDenseMatmul(csr.view, bf16_values.data(), dim, sce::Quantization(),
                               expected.data(), sce::RunSerially, {}, isa);
        sce::SparseDenseMatmul(csr.view, bf16.data(), dim, sce::Quantization(), got.data(),
                               sce::RunSerially, {}, isa);
        CHECK(std::memcmp(expected.data(), got.data(), out * 4) == 0);
        sce::SparseDenseMatmul(csr.view, f16_values.data(), dim, sce::Quantization(),
                               expected.data(), sce::RunSerially, {}, isa);
        sce::SparseDenseMatmul(csr.view, f16.data(), dim, sce::Quantization(), got.data(),
                               sce::RunSerially, {}, isa);
        CHECK(std::memcmp(expected.data(), got.data(), out * 4) == 0);
      }
    }
  }
}

void TestNarrowRowUpdate() {
  g_test = "fused update of 16-bit rows: the float32 update of the widened rows, rounded with the "
           "bits of (seed, logical row, column, step); slots as in float32; every ISA alike";
  // Logical rows: table row p * R + offset + j of member m holds logical row j * N + k with
  // shard p = (k + rotation) mod N (docs/layout.md).
  sce::RowRounding layout;
  layout.members = {{0, 3, 11}, {5, 1, 22}};
  layout.num_shards = 8;
  layout.rows_per_shard = 9;
  layout.first_local_shard = 0;
  for (int64_t m = 0; m < 2; ++m) {
    const int64_t offset = m == 0 ? 0 : 5, rows = m == 0 ? 5 : 4;
    for (int64_t r = 0; r < rows * 8; ++r) {
      const int64_t k = r % 8, j = r / 8;
      const int64_t shard = (k + layout.members[m].rotation) % 8;
      uint64_t seed = 0;
      CHECK_EQ(layout.LogicalRow(shard * 9 + offset + j, &seed), r);
      CHECK_EQ(seed, layout.members[m].seed);
    }
  }
  // The update walks the members of increasing tokens instead of searching them.
  for (size_t first : {size_t{0}, size_t{1}}) {
    size_t member = first;
    for (int64_t token = first == 0 ? 0 : 5; token < 9; ++token) {
      member = layout.MemberFrom(member, token);
      CHECK_EQ(member, layout.MemberOf(token));
    }
  }
  const float none[1] = {0.0f};
  for (int64_t dim : {8, 5, 16, 32, 64, 72}) {  // any width, the fixed-width builds, 64 + 8
    for (uint32_t seed = 0; seed < 3; ++seed) {
      RandomCsr csr(seed, 2, 4, 2, 9, 7);
      const int64_t rows = csr.view.table_rows;
      FloatVec grads(csr.view.input_size * dim);
      for (size_t i = 0; i < grads.size(); ++i) grads[i] = std::sin(0.37f * i + seed) * 0.5f;
      sce::RowRounding rounding;  // three member tables of 4, 3 and 2 rows per shard
      rounding.members = {{0, 1, 77}, {4, 3, 99}, {7, 0, 5}};
      rounding.num_shards = csr.view.num_shards();
      CHECK_EQ(csr.view.rows_per_shard(), int64_t{9});
      rounding.rows_per_shard = csr.view.rows_per_shard();  // (FusedUpdateNarrow sets its own)
      rounding.step = 5 + seed;
      for (bool stochastic : {true, false}) {
        rounding.stochastic = stochastic;
        // float32 reference on the widened bfloat16 values
        TableAndSlots<sce::AdagradOptimizer> wide(rows, dim);
        std::vector<sce::Bfloat16> narrow(wide.table.size());
        for (size_t i = 0; i < narrow.size(); ++i) {
          narrow[i].bits = sce::FloatToBfloat16Nearest(wide.table[i]);
          wide.table[i] = sce::Bfloat16ToFloat(narrow[i].bits);
        }
        TableAndSlots<sce::AdagradOptimizer> slots(rows, dim);
        sce::FusedUpdate<sce::AdagradOptimizer>(
            csr.view, sce::GradientRows::InCsrOrder(csr.view, grads.data(), dim), dim, 0.05f,
            none, sce::Clip(), wide.table.data(), wide.slot_pointers, sce::RunSerially);
        for (sce::VectorIsa isa : SupportedIsas()) {
          std::vector<sce::Bfloat16> got = narrow;
          TableAndSlots<sce::AdagradOptimizer> got_slots(rows, dim);
          int64_t overflow_row = -1;
          const int64_t skipped = sce::FusedUpdateNarrow<sce::AdagradOptimizer>(
              csr.view, sce::GradientRows::InCsrOrder(csr.view, grads.data(), dim), dim, 0.05f,
              none, sce::Clip(), got.data(), rounding, got_slots.slot_pointers, sce::RunSerially,
              nullptr, &overflow_row, isa);
          CHECK_EQ(skipped, int64_t{0});
          bool same = std::memcmp(got_slots.slots[0].data(), wide.slots[0].data(),
                                  wide.slots[0].size() * 4) == 0;
          for (int64_t row = 0; row < rows; ++row) {
            uint64_t member_seed;
            const int64_t logical = rounding.LogicalRow(row, &member_seed);
            for (int64_t j = 0; j < dim; ++j) {
              bool overflow = false;
              const uint64_t bits = stochastic ? sce::ColumnRoundingBits<sce::Bfloat16>(
                                                     member_seed, logical, j, rounding.step)
                                               : 0;
              const uint16_t want =
                  stochastic ? sce::FloatToBfloat16Stochastic(wide.table[row * dim + j], bits,
                                                              &overflow)
                             : sce::FloatToBfloat16Nearest(wide.table[row * dim + j]);
              same = same && got[row * dim + j].bits == want;
            }
          }
          CHECK(same);
        }
      }
    }
  }
  // float16: an update past 65504 fails before anything is written.
  RandomCsr csr(1, 1, 4, 1, 9, 7);
  const int64_t dim = 4, rows = csr.view.table_rows;
  FloatVec grads(csr.view.input_size * dim, -1000.0f);
  std::vector<sce::Float16> table(rows * dim);
  bool unused = false;
  for (auto& v : table) v.bits = sce::FloatToFloat16Nearest(65000.0f, &unused);
  const std::vector<sce::Float16> before = table;
  TableAndSlots<sce::SgdOptimizer> sgd(rows, dim);
  sce::RowRounding rounding;
  rounding.members = {{0, 0, 1}};
  rounding.num_shards = csr.view.num_shards();
  int64_t overflow_row = -1;
  const int64_t result = sce::FusedUpdateNarrow<sce::SgdOptimizer>(
      csr.view, sce::GradientRows::InCsrOrder(csr.view, grads.data(), dim), dim, 1.0f, none,
      sce::Clip(), table.data(), rounding, sgd.slot_pointers, sce::RunSerially, nullptr,
      &overflow_row);
  CHECK_EQ(result, int64_t{-1});
  CHECK(overflow_row >= 0 && overflow_row < rows);
  CHECK(std::memcmp(table.data(), before.data(), table.size() * 2) == 0);
}

void TestFeatureMajorActivations() {
  g_test = "lookup: feature-major activations are the SparseCore-major ones, rows permuted";
  ForEachLookupCase([](const RandomCsr& csr, const FloatVec& table, int64_t G) {
    const int64_t dim = kLookupTestDim;
    const sce::FeatureRowsPerSc features = {3, 0, 4};
    CHECK_OK(sce::ValidateFeatureRows(features, csr.view));
    FloatVec sc_major(csr.view.input_size * dim, -1.0f), feature_major(sc_major.size(), -1.0f);
    sce::SparseDenseMatmul(csr.view, table.data(), dim, sce::Quantization(), sc_major.data(),
                           sce::RunSerially);
    sce::SparseDenseMatmul(csr.view, table.data(), dim, sce::Quantization(),
                           feature_major.data(), sce::RunSerially, features);
    // Source SparseCore sc = g * 4 + s, sample j of feature f (local = offset_f + j) lands at
    // g * 28 + 4 * offset_f + s * rows_f + j.
    bool same = true;
    for (int64_t sc = 0; sc < G * 4; ++sc) {
      const int64_t g = sc / 4, s = sc % 4;
      int64_t offset = 0;
      for (int64_t rows_f : features) {
        for (int64_t j = 0; j < rows_f; ++j) {
          const int64_t from = sc * 7 + offset + j;
          const int64_t to = g * 28 + 4 * offset + s * rows_f + j;
          same = same && std::memcmp(&sc_major[from * dim], &feature_major[to * dim],
                                     dim * sizeof(float)) == 0;
        }
        offset += rows_f;
      }
    }
    CHECK(same);
  });
  RandomCsr csr(0, 1, 4, 1, 9, 7);
  CHECK_OK(sce::ValidateFeatureRows({}, csr.view));
  CHECK_ERROR(sce::ValidateFeatureRows({3, 3}, csr.view), "must sum to the 7 samples");
  CHECK_ERROR(sce::ValidateFeatureRows({8, -1}, csr.view), "sizes >= 0");
  CHECK_ERROR(sce::ValidateFeatureRows({INT64_MAX, 1}, csr.view), "overflow int64");
}

// The same gradients in the CSR's order, feature-major (one buffer) and per feature (one buffer
// each), for `features` rows per SparseCore of 4 SparseCores per replica: source SparseCore
// sc = g * 4 + s, sample j of feature f lands at g * 4 * B + 4 * offset_f + s * rows_f + j of the
// feature-major buffer (B samples per SparseCore), and at row sc * rows_f + j of feature f's.
struct GradientLayouts {
  FloatVec sc_major, feature_major;
  std::vector<FloatVec> per_feature;
  std::vector<const float*> parts;
  GradientLayouts(const FloatVec& csr_order, const sce::FeatureRowsPerSc& features,
                  int64_t num_sources, int64_t dim)
      : sc_major(csr_order), feature_major(csr_order.size()) {
    int64_t samples_per_sc = 0;
    for (int64_t rows_f : features) samples_per_sc += rows_f;
    for (int64_t rows_f : features) per_feature.emplace_back(num_sources * rows_f * dim);
    for (int64_t sc = 0; sc < num_sources; ++sc) {
      const int64_t g = sc / 4, s = sc % 4;
      int64_t offset = 0;
      for (size_t f = 0; f < features.size(); ++f) {
        for (int64_t j = 0; j < features[f]; ++j) {
          const float* from = &sc_major[(sc * samples_per_sc + offset + j) * dim];
          std::copy_n(from, dim, &feature_major[(g * 4 * samples_per_sc + 4 * offset +
                                                 s * features[f] + j) * dim]);
          std::copy_n(from, dim, &per_feature[f][(sc * features[f] + j) * dim]);
        }
        offset += features[f];
      }
    }
    for (const FloatVec& part : per_feature) parts.push_back(part.data());
  }
};

void TestFusedUpdateGradientOrders() {
  g_test = "fused update: gradients feature-major or per feature give the same update";
  const sce::FeatureRowsPerSc features = {3, 0, 4};
  const float none[1] = {0.0f};
  // G = 5: 40 runs per shard, more than kMaxStreamedRuns; unsorted segments: both take the
  // update's fallback (collected contributions) instead of the streamed merge.
  for (int64_t G : {1, 2, 5}) {
    for (bool sorted : {true, false}) {
      for (uint32_t seed = 0; seed < 4; ++seed) {
        RandomCsr csr(seed, G, 4, 2, 9, 7, sorted);
        CHECK_OK(sce::ValidateCsrView(csr.view));
        CHECK_OK(sce::ValidateFeatureRows(features, csr.view));
        const int64_t dim = 5, rows = csr.view.table_rows;
        const int64_t num_sources = csr.view.num_source_sparse_cores();
        FloatVec csr_order(csr.view.input_size * dim);
        for (size_t i = 0; i < csr_order.size(); ++i) csr_order[i] = std::sin(0.37f * i + seed);
        const GradientLayouts layouts(csr_order, features, num_sources, dim);
        std::vector<int64_t> part_rows;
        for (int64_t rows_f : features) part_rows.push_back(num_sources * rows_f);
        CHECK_OK(sce::ValidateGradientParts(csr.view, features, part_rows, "grads"));
        CHECK_OK(sce::ValidateGradientParts(csr.view, features, {csr.view.input_size}, "grads"));
        const sce::GradientRows in_csr_order =
            sce::GradientRows::InCsrOrder(csr.view, layouts.sc_major.data(), dim);
        const sce::GradientRows major(csr.view, features, {layouts.feature_major.data()}, dim);
        const sce::GradientRows split(csr.view, features, layouts.parts, dim);
        TableAndSlots<sce::AdagradOptimizer> expected(rows, dim);
        sce::FusedUpdate<sce::AdagradOptimizer>(csr.view, in_csr_order, dim, 0.05f, none,
                                                sce::Clip(), expected.table.data(),
                                                expected.slot_pointers, sce::RunSerially);
        for (const sce::GradientRows* grads : {&major, &split}) {
          TableAndSlots<sce::AdagradOptimizer> got(rows, dim);
          sce::FusedUpdate<sce::AdagradOptimizer>(csr.view, *grads, dim, 0.05f, none,
                                                  sce::Clip(), got.table.data(),
                                                  got.slot_pointers, sce::RunSerially);
          CHECK(expected.SameBits(got));
        }
        // Reading the feature-major buffer as if it were in the CSR's order is another update.
        TableAndSlots<sce::AdagradOptimizer> misread(rows, dim);
        sce::FusedUpdate<sce::AdagradOptimizer>(
            csr.view, sce::GradientRows::InCsrOrder(csr.view, layouts.feature_major.data(), dim),
            dim, 0.05f, none, sce::Clip(), misread.table.data(), misread.slot_pointers,
            sce::RunSerially);
        CHECK(!expected.SameBits(misread));
        // A NaN in one activation row is flagged at that row (CSR numbering) in every order, and
        // the skipping update leaves the same rows unchanged.
        FloatVec with_nan = csr_order;
        const int64_t nan_row = (seed * 11 + G) % csr.view.input_size;
        with_nan[nan_row * dim + seed % dim] = std::nanf("");
        const GradientLayouts nan_layouts(with_nan, features, num_sources, dim);
        const sce::GradientRows nan_grads[] = {
            sce::GradientRows::InCsrOrder(csr.view, nan_layouts.sc_major.data(), dim),
            sce::GradientRows(csr.view, features, {nan_layouts.feature_major.data()}, dim),
            sce::GradientRows(csr.view, features, nan_layouts.parts, dim)};
        std::vector<uint8_t> expected_bad(csr.view.input_size, 0);
        expected_bad[nan_row] = 1;
        TableAndSlots<sce::AdagradOptimizer> skipped_first(rows, dim);
        int64_t first_skipped = -1;
        for (const sce::GradientRows& grads : nan_grads) {
          std::vector<uint8_t> bad;
          sce::NonFiniteContribution first;
          sce::FindNonFiniteContributions(csr.view, grads, dim, &bad, &first);
          CHECK(bad == expected_bad);
          TableAndSlots<sce::AdagradOptimizer> got(rows, dim);
          const int64_t skipped = sce::FusedUpdate<sce::AdagradOptimizer>(
              csr.view, grads, dim, 0.05f, none, sce::Clip(), got.table.data(),
              got.slot_pointers, sce::RunSerially, bad.data());
          if (first_skipped < 0) {
            first_skipped = skipped;
            skipped_first.table = got.table;
            skipped_first.slots = got.slots;
          }
          CHECK_EQ(skipped, first_skipped);
          CHECK(skipped_first.SameBits(got));
        }
      }
    }
  }
  RandomCsr csr(0, 2, 4, 1, 9, 7);
  CHECK_OK(sce::ValidateGradientParts(csr.view, features, {24, 0, 32}, "grads"));
  CHECK_ERROR(sce::ValidateGradientParts(csr.view, features, {25, 0, 31}, "grads"),
              "grads[0] has 25 rows, expected 8 source SparseCores x 3 rows of feature 0");
  CHECK_ERROR(sce::ValidateGradientParts(csr.view, features, {24, 0}, "grads"),
              "grads holds 2 tensors; give one, or one per entry of feature_rows_per_sc (3)");
  CHECK_ERROR(sce::ValidateGradientParts(csr.view, {}, {28, 28}, "grads"), "holds 2 tensors");
  CHECK_ERROR(sce::ValidateGradientParts(csr.view, {7}, {55}, "grads"),
              "grads has 55 rows, expected 56");
}

void TestGatheredSegmentSum() {
  g_test = "gathered segment sum: worked example, any split into ranges and ISA, checked input";
  // rows r0 = (1, 2), r1 = (10, 20); out[0] = 2*r1 + 1*r0, out[1] untouched, out[2] = 0.5*r1.
  const FloatVec rows = {1, 2, 10, 20};
  const IntVec positions = {1, 1, 0};
  const FloatVec gains = {2, 0.5f, 1};
  const IntVec segments = {0, 2, 0};
  sce::GatheredSegmentSumArgs args;
  args.rows = rows.data();
  args.num_rows = 2;
  args.width = 2;
  args.positions = positions.data();
  args.gains = gains.data();
  args.segments = segments.data();
  args.num_entries = 3;
  args.num_segments = 3;
  CHECK_OK(sce::ValidateGatheredSegmentSum(args, "table 't'"));
  FloatVec out(6, -1.0f);  // the op zero-fills every output row
  sce::GatheredSegmentSum(args, out.data(), sce::RunSerially, 1);
  CHECK_EQ(out, (FloatVec{21, 42, 0, 0, 5, 10}));

  // Random inputs over many ranges: the result is the entry-order reference bit for bit, however
  // the ranges are handed out (one at a time, in reverse).
  std::mt19937 rng(5);
  for (int round = 0; round < 40; ++round) {
    // Every other round takes a width with a build of its own (vector_isa.h), each in turn;
    // rounds 20 and on sort the segments (the forward direction, a path of its own) and give
    // some rows zeros and some gains a negative sign (-0.0 products sum to +0.0).
    const bool sorted = round >= 20;
    const int64_t num_rows = 1 + rng() % 50, n = rng() % 5000;
    const int64_t width = round % 2 ? sce::kFixedRowWidths[round / 2 % 3] : 1 + rng() % 40;
    const int64_t num_segments = 1 + rng() % 3000;
    FloatVec r(num_rows * width), g(n);
    IntVec p(n), s(n);
    std::normal_distribution<float> normal;
    for (float& x : r) x = sorted && rng() % 4 == 0 ? 0.0f : normal(rng);
    for (int64_t i = 0; i < n; ++i) {
      p[i] = static_cast<int32_t>(rng() % num_rows);
      s[i] = static_cast<int32_t>(rng() % num_segments);
      g[i] = normal(rng);
    }
    if (sorted) std::sort(s.begin(), s.end());
    FloatVec expected(num_segments * width, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t d = 0; d < width; ++d) {
        const float product = g[i] * r[p[i] * width + d];
        expected[s[i] * width + d] += product;
      }
    }
    sce::GatheredSegmentSumArgs a{r.data(), num_rows, width, p.data(), g.data(), s.data(), n,
                                  num_segments};
    CHECK_OK(sce::ValidateGatheredSegmentSum(a, "t"));
    FloatVec got(num_segments * width, 7.0f);
    auto one_at_a_time_reversed = [](int64_t units, int64_t, const sce::RangeFn& work) {
      for (int64_t u = units - 1; u >= 0; --u) work(u, u + 1);
    };
    for (int64_t max_ranges : {1, 2, 3, 8, 1000}) {
      for (sce::VectorIsa isa : SupportedIsas()) {
        std::fill(got.begin(), got.end(), 7.0f);
        sce::GatheredSegmentSum(a, got.data(), one_at_a_time_reversed, max_ranges, isa);
        CHECK(std::memcmp(got.data(), expected.data(), sizeof(float) * got.size()) == 0);
      }
    }
  }

  // Checked input: indices, counts and the output size, before anything is written.
  const IntVec bad_position = {0, 2, 0};
  args.positions = bad_position.data();
  CHECK_ERROR(sce::ValidateGatheredSegmentSum(args, "table 't'"), "positions[1] = 2");
  args.positions = positions.data();
  const IntVec bad_segment = {0, 0, -3};
  args.segments = bad_segment.data();
  CHECK_ERROR(sce::ValidateGatheredSegmentSum(args, "table 't'"), "segment_ids[2] = -3");
  args.segments = segments.data();
  args.num_segments = -1;
  CHECK_ERROR(sce::ValidateGatheredSegmentSum(args, "table 't'"), "num_segments");
  args.num_segments = int64_t{1} << 27;
  args.width = 4;  // 2^29 output elements
  CHECK_ERROR(sce::ValidateGatheredSegmentSum(args, "table 't'"), "exceeds the limit");
  args.width = 2;
  args.num_segments = 3;
  args.num_entries = int64_t{1} << 40;
  CHECK_ERROR(sce::ValidateGatheredSegmentSum(args, "table 't'"), "number of entries");
  args.num_entries = 3;
  args.gains = nullptr;
  CHECK_ERROR(sce::ValidateGatheredSegmentSum(args, "table 't'"), "must hold 3 entries");
}

void TestFeatureRowTables() {
  g_test = "gathered segment sum: per-feature row tables give the stacked sum's rows";
  // S = 2, features of 1 and 2 rows per SparseCore: stacked rows 0..5 are f0[0], f1[0], f1[1],
  // f0[1], f1[2], f1[3].
  int64_t stacked = 0;
  CHECK_OK(sce::CheckFeatureBlocks(2, {1, 2}, "table 't'", &stacked));
  CHECK_EQ(stacked, int64_t{6});
  FloatVec f0(2), f1(4);
  std::vector<float*> table;
  sce::FeatureRowTable<float>(2, {1, 2}, {f0.data(), f1.data()}, 1, &table);
  CHECK(table.size() == 6 && table[0] == &f0[0] && table[1] == &f1[0] && table[2] == &f1[1] &&
        table[3] == &f0[1] && table[4] == &f1[2] && table[5] == &f1[3]);
  // out[stacked row s] = rows[0] * (s + 1), written through the table.
  const FloatVec rows = {3};
  const IntVec positions = {0, 0, 0, 0, 0, 0};
  const FloatVec gains = {1, 2, 3, 4, 5, 6};
  const IntVec segments = {0, 1, 2, 3, 4, 5};
  sce::GatheredSegmentSumArgs args;
  args.rows = rows.data();
  args.num_rows = 1;
  args.width = 1;
  args.positions = positions.data();
  args.gains = gains.data();
  args.segments = segments.data();
  args.num_entries = 6;
  args.num_segments = 6;
  args.out_table = table.data();
  CHECK_OK(sce::ValidateGatheredSegmentSum(args, "t"));
  sce::GatheredSegmentSum(args, nullptr, sce::RunSerially, 3);
  CHECK_EQ(f0, (FloatVec{3, 12}));
  CHECK_EQ(f1, (FloatVec{6, 9, 15, 18}));
  CHECK_ERROR(sce::CheckFeatureBlocks(0, {1}, "t", &stacked), "sparse_cores");
  CHECK_ERROR(sce::CheckFeatureBlocks(2, {}, "t", &stacked), "no features");
  CHECK_ERROR(sce::CheckFeatureBlocks(2, {-1}, "t", &stacked), "feature_rows_per_sc[0] = -1");
  CHECK_ERROR(sce::CheckFeatureBlocks(4, {int64_t{1} << 30}, "t", &stacked), "stacked rows");
}

void TestReplicaChunks() {
  g_test = "replica chunks: worked example, round trip, checked counts and sizes";
  // Two replicas, two tables of widths 1 and 2, chunk 5. Replica 0 gets 1 entry of table 0 and
  // 1 of table 1; replica 1 gets 2 of table 0 and none of table 1.
  const std::vector<uint32_t> t0 = {10, 11, 12};
  const std::vector<uint32_t> t1 = {20, 21};
  const IntVec counts = {1, 1, 2, 0};
  sce::ReplicaChunks chunks;
  chunks.num_replicas = 2;
  chunks.chunk = 5;
  chunks.widths = {1, 2};
  chunks.counts = counts.data();
  std::vector<int64_t> rows;
  CHECK_OK(sce::ValidateReplicaChunks(chunks, "x", &rows));
  CHECK(rows == (std::vector<int64_t>{3, 1}));
  std::vector<uint32_t> buffer(10, 99);
  sce::PackReplicaChunks(chunks, {t0.data(), t1.data()}, buffer.data());
  CHECK(buffer == (std::vector<uint32_t>{10, 20, 21, 0, 0, 11, 12, 0, 0, 0}));
  std::vector<uint32_t> back0(3), back1(2);
  sce::UnpackReplicaChunks(chunks, buffer.data(), {back0.data(), back1.data()});
  CHECK(back0 == t0);
  CHECK(back1 == t1);

  // Checked: negative counts, overfull chunks, oversized buffers, bad widths.
  const IntVec negative = {1, -1, 0, 0};
  chunks.counts = negative.data();
  CHECK_ERROR(sce::ValidateReplicaChunks(chunks, "x", &rows), "counts[0, 1] = -1 is negative");
  const IntVec overfull = {1, 1, 2, 2};
  chunks.counts = overfull.data();
  CHECK_ERROR(sce::ValidateReplicaChunks(chunks, "x", &rows), "more than chunk = 5");
  const IntVec huge = {1, 1, 2147483647, 0};
  chunks.counts = huge.data();
  CHECK_ERROR(sce::ValidateReplicaChunks(chunks, "x", &rows), "more than chunk");
  chunks.counts = counts.data();
  chunks.chunk = int64_t{1} << 28;
  CHECK_ERROR(sce::ValidateReplicaChunks(chunks, "x", &rows), "exceeds the limit");
  chunks.chunk = -1;
  CHECK_ERROR(sce::ValidateReplicaChunks(chunks, "x", &rows), "chunk must be in");
  chunks.chunk = 5;
  chunks.widths = {1, 0};
  CHECK_ERROR(sce::ValidateReplicaChunks(chunks, "x", &rows), "width");
  chunks.widths = {1, 2};
  chunks.num_replicas = 0;
  CHECK_ERROR(sce::ValidateReplicaChunks(chunks, "x", &rows), "number of replicas");
}

void TestIdRouting() {
  g_test = "id routing: worked example, duplicates, grouping by owner, checked ids";
  // W = 2, S = 2, R = 3 (N = 4 shards, 12 rows). id 5: shard 1, owner 0, row 1*3 + 1 = 4;
  // id 6: shard 2, owner 1, row 0*3 + 1 = 1; id 3: shard 3, owner 1, row 1*3 + 0 = 3.
  sce::IdRoutingParams params;
  params.num_replicas = 2;
  params.sparse_cores_per_replica = 2;
  params.rows_per_shard = 3;
  const IntVec ids = {6, 5, 3, 6};
  CHECK_OK(sce::ValidateIdRouting(params, ids.data(), 4, "table 't'"));
  sce::IdRoute route;
  sce::RouteIds(params, ids.data(), 4, &route);
  CHECK_EQ(route.rows, (IntVec{4, 1, 3}));
  CHECK_EQ(route.counts, (IntVec{1, 2}));
  CHECK_EQ(route.positions, (IntVec{1, 0, 2, 1}));

  // Many ids (the radix-sort path): every id maps back to itself through its unique row.
  std::mt19937 rng(11);
  params.num_replicas = 3;
  params.sparse_cores_per_replica = 4;
  params.rows_per_shard = 1000;
  IntVec many(5000);
  for (int32_t& id : many) id = static_cast<int32_t>(rng() % 12000);
  sce::RouteIds(params, many.data(), 5000, &route);
  bool consistent = true;
  int64_t total = 0;
  for (int32_t c : route.counts) total += c;
  consistent = consistent && total == static_cast<int64_t>(route.rows.size());
  std::vector<int32_t> owner_of_unique;
  for (int32_t d = 0; d < 3; ++d) owner_of_unique.insert(owner_of_unique.end(), route.counts[d], d);
  for (size_t k = 1; k < route.rows.size(); ++k) {
    consistent = consistent && (owner_of_unique[k] > owner_of_unique[k - 1] ||
                                route.rows[k] > route.rows[k - 1]);
  }
  for (size_t i = 0; i < many.size(); ++i) {
    const int32_t u = route.positions[i];
    const int32_t shard = many[i] % 12;
    consistent = consistent && owner_of_unique[u] == shard / 4 &&
                 route.rows[u] == (shard % 4) * 1000 + many[i] / 12;
  }
  CHECK(consistent);

  const IntVec bad = {0, 12000};
  CHECK_ERROR(sce::ValidateIdRouting(params, bad.data(), 2, "table 't'"), "ids[1] = 12000");
  params.rows_per_shard = int64_t{1} << 30;
  CHECK_ERROR(sce::ValidateIdRouting(params, nullptr, 0, "table 't'"), "exceeds the limit");
  params.rows_per_shard = 0;
  CHECK_ERROR(sce::ValidateIdRouting(params, nullptr, 0, "table 't'"), "rows_per_shard");
}

// The partition maxima of a stacked COO by brute force: distinct (row, col) pairs and distinct
// (SparseCore, col) pairs per (row div per_sc, col mod N).
std::pair<int32_t, int32_t> BruteForcePartitionMaxima(const IntVec& rows, const IntVec& cols,
                                                      int64_t N, int64_t per_sc) {
  std::vector<std::array<int64_t, 2>> pairs, sc_cols;
  for (size_t i = 0; i < rows.size(); ++i) {
    pairs.push_back({rows[i], cols[i]});
    sc_cols.push_back({rows[i] / per_sc, cols[i]});
  }
  auto max_per_partition = [&](std::vector<std::array<int64_t, 2>> v, bool rows_given) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    std::vector<std::array<int64_t, 2>> partitions;
    for (const auto& e : v) partitions.push_back({rows_given ? e[0] / per_sc : e[0], e[1] % N});
    std::sort(partitions.begin(), partitions.end());
    int32_t best = 0;
    for (size_t a = 0, b = 0; a < partitions.size(); a = b) {
      while (b < partitions.size() && partitions[b] == partitions[a]) ++b;
      best = std::max(best, static_cast<int32_t>(b - a));
    }
    return best;
  };
  return {max_per_partition(pairs, true), max_per_partition(sc_cols, false)};
}

void TestIdRoutingPartitionMaxima() {
  g_test = "id routing: partition maxima vs brute force and the minibatch splits, checked rows";
  // W = 2, S = 2, R = 3 (N = 4), 2 rows per SparseCore. SparseCore 0 (rows 0-1) sends ids 1, 5
  // and 9 to shard 1 as the (row, col) pairs (0,1), (0,5), (1,5) (twice: one id) and (1,9):
  // 4 ids, 3 unique. SparseCore 1 (rows 2-3) sends id 2 from two rows to shard 2: 2 ids, 1 unique.
  sce::IdRoutingParams params;
  params.num_replicas = 2;
  params.sparse_cores_per_replica = 2;
  params.rows_per_shard = 3;
  const IntVec rows = {0, 0, 1, 1, 1, 2, 3};
  const IntVec cols = {1, 5, 5, 5, 9, 2, 2};
  sce::IdSampleRows sample_rows{2, rows.data(), 7};
  CHECK_OK(sce::ValidateIdSampleRows(params, sample_rows, 7, "table 't'"));
  sce::IdRoute with, without;
  sce::RouteIds(params, cols.data(), 7, sample_rows, &with);
  sce::RouteIds(params, cols.data(), 7, &without);
  CHECK_EQ(with.max_ids, 4);
  CHECK_EQ(with.max_unique_ids, 3);
  CHECK_EQ(without.max_ids, 0);
  CHECK_EQ(without.max_unique_ids, 0);
  CHECK_EQ(with.rows, without.rows);
  CHECK_EQ(with.counts, without.counts);
  CHECK_EQ(with.positions, without.positions);
  sce::RouteIds(params, cols.data(), 0, sce::IdSampleRows{2, rows.data(), 0}, &with);
  CHECK_EQ(with.max_ids, 0);
  CHECK_EQ(with.max_unique_ids, 0);

  // Random stacked COOs (rows sorted, repeated ids within samples, hot cols) against brute force
  // and, when W * S is a power of two, against GetMinibatchSplits at level 0 without limits.
  std::mt19937 rng(23);
  bool agree = true, splits_agree = true;
  for (int trial = 0; trial < 300; ++trial) {
    params.num_replicas = 1 + rng() % 5;
    params.sparse_cores_per_replica = int64_t{1} << (rng() % 3);
    params.rows_per_shard = 1 + rng() % 200;
    const int64_t N = params.num_replicas * params.sparse_cores_per_replica;
    const int64_t per_sc = 1 + rng() % 30;
    const int64_t samples = params.sparse_cores_per_replica * per_sc;
    const int64_t vocab = N * params.rows_per_shard;
    const int64_t high = rng() % 2 ? std::min<int64_t>(vocab, 1 + rng() % 20) : vocab;
    const size_t n = rng() % 600;
    IntVec r(n), c(n);
    for (size_t i = 0; i < n; ++i) r[i] = static_cast<int32_t>(rng() % samples);
    std::sort(r.begin(), r.end());
    for (size_t i = 0; i < n; ++i) {
      // Now and then the previous id of the same sample again.
      c[i] = i > 0 && r[i] == r[i - 1] && rng() % 4 == 0 ? c[i - 1]
                                                          : static_cast<int32_t>(rng() % high);
    }
    sample_rows = sce::IdSampleRows{per_sc, r.data(), static_cast<int64_t>(n)};
    if (!sce::ValidateIdRouting(params, c.data(), n, "t").ok() ||
        !sce::ValidateIdSampleRows(params, sample_rows, n, "t").ok()) {
      agree = false;
      continue;
    }
    sce::RouteIds(params, c.data(), n, sample_rows, &with);
    const auto expected = BruteForcePartitionMaxima(r, c, N, per_sc);
    agree = agree && with.max_ids == expected.first && with.max_unique_ids == expected.second;
    if ((N & (N - 1)) != 0) continue;
    sce::MinibatchSplitsParams sp;
    sp.sample_count = samples;
    sp.num_replica = params.num_replicas;
    sp.num_sc_per_chip = params.sparse_cores_per_replica;
    sp.table_vocab_size = vocab;
    sp.max_ids_per_partition = sce::kMaxInt32;
    sp.max_unique_ids_per_partition = sce::kMaxInt32;
    sp.max_division_level = 0;
    sp.table_name = "t";
    const std::vector<float> gains(n, 1.0f);
    sce::MinibatchSplits splits;
    const sce::Status status = sce::GetMinibatchSplits(r.data(), c.data(), gains.data(), n, n, n,
                                                       sp, &splits);
    splits_agree = splits_agree && status.ok() && splits.max_ids == with.max_ids &&
                   splits.max_uniques == with.max_unique_ids;
  }
  CHECK(agree);
  CHECK(splits_agree);

  // Checked rows and attributes; a failed check leaves the route as it was (nothing is routed).
  params.num_replicas = 2;
  params.sparse_cores_per_replica = 2;
  params.rows_per_shard = 3;
  const IntVec ids = {1, 2, 3};
  const IntVec decreasing = {0, 3, 2}, out_of_range = {0, 1, 4}, negative = {-1, 0, 0};
  CHECK_ERROR(sce::ValidateIdSampleRows(params, {2, decreasing.data(), 2}, 3, "table 't'"),
              "table 't': row_ids has 2 entries but ids has 3");
  CHECK_ERROR(sce::ValidateIdSampleRows(params, {2, decreasing.data(), 3}, 3, "table 't'"),
              "row_ids[2] = 2 is smaller than row_ids[1] = 3");
  CHECK_ERROR(sce::ValidateIdSampleRows(params, {2, out_of_range.data(), 3}, 3, "table 't'"),
              "row_ids[2] = 4 is not a sample row in [0, 4)");
  CHECK_ERROR(sce::ValidateIdSampleRows(params, {2, negative.data(), 3}, 3, "table 't'"),
              "row_ids[0] = -1");
  CHECK_ERROR(sce::ValidateIdSampleRows(params, {2, nullptr, 3}, 3, "table 't'"),
              "row_ids missing");
  CHECK_ERROR(sce::ValidateIdSampleRows(params, {-1, nullptr, 0}, 0, "table 't'"),
              "rows_per_sparse_core must be in");
  CHECK_ERROR(sce::ValidateIdSampleRows(params, {int64_t{1} << 30, nullptr, 0}, 0, "table 't'"),
              "exceeds the limit");
  CHECK_ERROR(sce::ValidateIdSampleRows(params, {int64_t{1} << 40, nullptr, 0}, 0, "table 't'"),
              "rows_per_sparse_core must be in");
  // Without statistics row_ids is not looked at.
  CHECK_OK(sce::ValidateIdSampleRows(params, {0, decreasing.data(), 1}, 3, "table 't'"));
  CHECK_OK(sce::ValidateIdSampleRows(params, {0, nullptr, 0}, 3, "table 't'"));
  // Near the largest accepted rows_per_sparse_core (S * it <= 2^31 - 1), rows on either side of
  // the SparseCore boundary: 2 ids of one unique id in each of the two partitions of shard 1.
  params.num_replicas = 1;
  const int64_t per_sc = (int64_t{1} << 30) - 1;
  const int32_t last = static_cast<int32_t>(per_sc - 1), first = static_cast<int32_t>(per_sc);
  const IntVec boundary_rows = {last - 1, last, first, static_cast<int32_t>(2 * per_sc - 1)};
  const IntVec same_ids = {1, 1, 1, 1};
  CHECK_OK(sce::ValidateIdSampleRows(params, {per_sc, boundary_rows.data(), 4}, 4, "table 't'"));
  sce::RouteIds(params, same_ids.data(), 4, {per_sc, boundary_rows.data(), 4}, &with);
  CHECK_EQ(with.max_ids, 2);
  CHECK_EQ(with.max_unique_ids, 1);
}

void TestOwnerCsr() {
  g_test = "owner csr: worked example, padding, checked rows";
  // W = 1, S = 2, R = 10: rows 13 (shard 1), 4 (shard 0), 15 (shard 1); M = 2: entries 0-1 are
  // samples 0-1 of source SparseCore 0, entry 2 is sample 0 of source SparseCore 1.
  sce::OwnerCsrParams params;
  params.num_replicas = 1;
  params.sparse_cores_per_replica = 2;
  params.rows_per_shard = 10;
  const IntVec rows = {13, 4, 15};
  sce::OwnerCsrSizes sizes;
  CHECK_OK(sce::ValidateOwnerCsr(params, rows.data(), 3, "table 't'", &sizes));
  CHECK_EQ(sizes.row_pointers, int64_t{16});
  CHECK_EQ(sizes.entries, int64_t{24});
  CHECK_EQ(sizes.activation_rows, int64_t{4});
  IntVec pointers(16), samples(24), tokens(24);
  FloatVec gains(24);
  sce::BuildOwnerCsr(params, rows.data(), 3, sizes, pointers.data(), samples.data(),
                     tokens.data(), gains.data());
  CHECK_EQ(pointers, (IntVec{1, 9, 16, 16, 16, 16, 16, 16, 16, 17, 24, 24, 24, 24, 24, 24}));
  CHECK_EQ(tokens[0], 4);
  CHECK_EQ(tokens[8], 3);
  CHECK_EQ(tokens[16], 5);
  CHECK_EQ(samples[0], 1);
  CHECK_EQ(samples[8], 0);
  CHECK_EQ(samples[16], 0);
  CHECK_EQ(tokens[1], sce::kPad);
  CHECK(gains[0] == 1.0f && gains[1] == static_cast<float>(sce::kPad));

  const IntVec bad = {0, 20};
  CHECK_ERROR(sce::ValidateOwnerCsr(params, bad.data(), 2, "table 't'", &sizes), "rows[1] = 20");
  params.replica_id = 1;
  CHECK_ERROR(sce::ValidateOwnerCsr(params, nullptr, 0, "table 't'", &sizes), "replica_id");
  params.replica_id = 0;
  params.rows_per_shard = int64_t{1} << 31;
  CHECK_ERROR(sce::ValidateOwnerCsr(params, nullptr, 0, "table 't'", &sizes), "rows_per_shard");
}

// The CPU's own float16 rounding (F16C, round to nearest even), the oracle of
// FloatToFloat16Nearest; only called when the CPU has F16C.
__attribute__((target("f16c"))) float F16cRound(float value) {
  return _cvtsh_ss(_cvtss_sh(value, 0));
}

// RoundRow's builds for each instruction set, as the update loops compile it.
#define SCE_DEFINE_ROUND_ROW(name, target)                                                   \
  template <int64_t kDim>                                                                    \
  target bool name(const float* wide, int64_t dim, uint64_t key, bool stochastic,            \
                   sce::Bfloat16* out) {                                                     \
    std::vector<uint64_t> words(sce::RoundingWords<sce::Bfloat16>(dim));                     \
    sce::FillRoundingWords<sce::Bfloat16, kDim>(key, dim, words.data());                     \
    return sce::RoundRow<kDim>(wide, dim, stochastic ? words.data() : nullptr, out);         \
  }
SCE_DEFINE_ROUND_ROW(RoundRowAvx512, SCE_TARGET_AVX512)
SCE_DEFINE_ROUND_ROW(RoundRowAvx2, SCE_TARGET_AVX2)
SCE_DEFINE_ROUND_ROW(RoundRowBaseline, )
#undef SCE_DEFINE_ROUND_ROW

void TestRoundRowIsElementWise() {
  g_test = "16-bit rows: a row rounded at once (every width build and ISA) is each value rounded "
           "alone with its ColumnRoundingBits, NaN, infinities and overflow included";
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 3.3895e38f, -3.3895e38f,
                            std::numeric_limits<float>::max(), 1e-40f, -1e-40f};
  using RoundFn = bool (*)(const float*, int64_t, uint64_t, bool, sce::Bfloat16*);
  for (sce::VectorIsa isa : SupportedIsas()) {
    for (int64_t dim : {1, 5, 16, 32, 64, 72, 130}) {
      RoundFn round = nullptr;
      const int build = sce::RowWidthBuild(dim);
#define SCE_PICK(kDim)                                                          \
  (isa == sce::VectorIsa::kAvx512 ? &RoundRowAvx512<kDim>                        \
   : isa == sce::VectorIsa::kAvx2 ? &RoundRowAvx2<kDim>                          \
                                  : &RoundRowBaseline<kDim>)
      round = build == 0   ? SCE_PICK(16)
              : build == 1 ? SCE_PICK(32)
              : build == 2 ? SCE_PICK(64)
                           : SCE_PICK(0);
#undef SCE_PICK
      for (int trial = 0; trial < 200; ++trial) {
        std::vector<float> wide(dim);
        // A third of the rows hold NaN and infinities, a third only finite values of which some
        // may round to an infinity, and a third only ordinary values (RoundRow's first pass
        // alone).
        const int kind = trial % 3;
        for (int64_t j = 0; j < dim; ++j) {
          const bool special = kind != 2 && rng() % 4 == 0;
          wide[j] = !special   ? uniform(rng)
                    : kind == 0 ? specials[rng() % std::size(specials)]
                                : (rng() % 2 ? 1.0f : -1.0f) * std::numeric_limits<float>::max() *
                                      (1.0f - std::ldexp(static_cast<float>(rng() % 512), -16));
        }
        const uint64_t seed = rng(), step = rng() % 1000;
        const int64_t row = rng() % 100000;
        for (bool stochastic : {true, false}) {
          std::vector<sce::Bfloat16> got(dim);
          const bool overflow =
              round(wide.data(), dim, sce::RowRoundingKey(seed, row, step), stochastic, got.data());
          bool want_overflow = false;
          for (int64_t j = 0; j < dim; ++j) {
            const uint16_t want =
                stochastic ? sce::FloatToBfloat16Stochastic(
                                 wide[j],
                                 sce::ColumnRoundingBits<sce::Bfloat16>(seed, row, j, step),
                                 &want_overflow)
                           : sce::FloatToBfloat16Nearest(wide[j]);
            CHECK_EQ(got[j].bits, want);
          }
          CHECK_EQ(overflow, want_overflow);
        }
      }
    }
  }
}

void TestRowPrecisionConversions() {
  g_test = "16-bit rows: float16 round trip of every pattern, nearest rounding like the "
           "CPU's F16C conversion, bfloat16 ties to even, overflow flagged";
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  if (!f16c) std::printf("(no F16C on this CPU: float16 rounding checked without its oracle)\n");
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const float value = sce::Float16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    bool overflow = false;
    CHECK_EQ(sce::FloatToFloat16Nearest(value, &overflow), static_cast<uint16_t>(bits));
    CHECK(!overflow);
    CHECK_EQ(sce::FloatToFloat16Stochastic(value, 0xffffffu, &overflow),
             static_cast<uint16_t>(bits));  // representable: never moved, whatever the bits
    if (f16c) CHECK_EQ(F16cRound(value), value);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> small(-1e-4f, 1e-4f);
  for (int i = 0; i < 200000; ++i) {
    const float value = (i % 2) ? wide(rng) : small(rng);
    bool overflow = false;
    const uint16_t ours = sce::FloatToFloat16Nearest(value, &overflow);
    if (!f16c) continue;
    const float oracle = F16cRound(value);
    CHECK_EQ(sce::Float16ToFloat(ours), oracle);
    CHECK_EQ(overflow, std::isinf(oracle));
  }
  bool overflow = false;
  CHECK_EQ(sce::Float16ToFloat(sce::FloatToFloat16Nearest(65519.0f, &overflow)), 65504.0f);
  CHECK(!overflow);
  sce::FloatToFloat16Nearest(65520.0f, &overflow);
  CHECK(overflow);
  overflow = false;
  sce::FloatToFloat16Stochastic(70000.0f, 0, &overflow);
  CHECK(overflow);
  // bfloat16: representable values stay; ties go to even; NaN stays NaN.
  CHECK_EQ(sce::Bfloat16ToFloat(sce::FloatToBfloat16Nearest(1.5f)), 1.5f);
  CHECK_EQ(sce::Bfloat16ToFloat(sce::FloatToBfloat16Nearest(1.0f + 1.0f / 256)), 1.0f);
  CHECK_EQ(sce::Bfloat16ToFloat(sce::FloatToBfloat16Nearest(1.0f + 3.0f / 256)),
           1.0f + 4.0f / 256);
  CHECK(std::isnan(sce::Bfloat16ToFloat(sce::FloatToBfloat16Nearest(NAN))));
  overflow = false;
  CHECK_EQ(sce::Bfloat16ToFloat(sce::FloatToBfloat16Stochastic(-2.5f, 0xffffu, &overflow)),
           -2.5f);
  CHECK(!overflow);
}

void TestStochasticRoundingIsUnbiased() {
  g_test = "16-bit rows: stochastic rounding is unbiased, and tiny updates that rounding to "
           "nearest loses move the value by their true amount";
  // Mean of many roundings of one value (normals, and a float16 subnormal): within 5 sigma.
  for (float value : {1.0f + 1e-3f, -3.14159f, 1000.3f, 3e-6f}) {
    const int n = 400000;
    double sum16 = 0.0, sumb = 0.0;
    bool overflow = false;
    for (int i = 0; i < n; ++i) {
      const uint64_t bits = sce::RoundingBits(11, 3, 5, i);
      sum16 += sce::Float16ToFloat(sce::FloatToFloat16Stochastic(value, bits, &overflow));
      sumb += sce::Bfloat16ToFloat(sce::FloatToBfloat16Stochastic(value, bits, &overflow));
    }
    CHECK(!overflow);
    bool unused = false;
    const uint16_t down16 = sce::FloatToFloat16Stochastic(value, 0xffffffu, &unused);
    const double step16 =
        std::fabs(sce::Float16ToFloat(static_cast<uint16_t>(down16 + 1)) -
                  sce::Float16ToFloat(down16));
    const double stepb = std::fabs(static_cast<double>(value)) / 128.0;
    CHECK(std::fabs(sum16 / n - value) < 5.0 * step16 / std::sqrt(4.0 * n));
    CHECK(std::fabs(sumb / n - value) < 5.0 * stepb / std::sqrt(4.0 * n));
  }
  // 200 columns, each a bfloat16 1.0 given 1,000 updates of -1e-5 (the step below 1.0 is
  // 2^-8 = 0.0039): rounding to nearest never moves them; with stochastic rounding their mean
  // ends at 1 - 0.01, within 4 standard deviations (about 512 moves of 0.0039 in all).
  double nearest_sum = 0.0, stochastic_sum = 0.0;
  bool overflow = false;
  for (int column = 0; column < 200; ++column) {
    uint16_t nearest = sce::FloatToBfloat16Nearest(1.0f);
    uint16_t stochastic = nearest;
    for (int step = 0; step < 1000; ++step) {
      nearest = sce::FloatToBfloat16Nearest(sce::Bfloat16ToFloat(nearest) - 1e-5f);
      stochastic = sce::FloatToBfloat16Stochastic(
          sce::Bfloat16ToFloat(stochastic) - 1e-5f, sce::RoundingBits(1, 0, column, step),
          &overflow);
    }
    nearest_sum += sce::Bfloat16ToFloat(nearest);
    stochastic_sum += sce::Bfloat16ToFloat(stochastic);
  }
  CHECK_EQ(nearest_sum / 200, 1.0);
  CHECK(std::fabs(stochastic_sum / 200 - 0.99) < 4.0 * std::sqrt(512.0) * 0.00390625 / 200);
  // The random bits are a pure function of (seed, row, column, step) and differ between
  // neighbours.
  CHECK_EQ(sce::RoundingBits(5, 6, 7, 8), sce::RoundingBits(5, 6, 7, 8));
  CHECK(sce::RoundingBits(5, 6, 7, 8) != sce::RoundingBits(5, 7, 7, 8));
  CHECK(sce::RoundingBits(5, 6, 7, 8) != sce::RoundingBits(5, 6, 8, 8));
  CHECK(sce::RoundingBits(5, 6, 7, 8) != sce::RoundingBits(5, 6, 7, 9));
  CHECK(sce::RoundingBits(5, 6, 7, 8) != sce::RoundingBits(6, 6, 7, 8));
}

// The block scans return exactly what a loop stopping at the first bad entry returns: bad
// entries planted around block edges, negative values, limits 0 and above 2^31.
void TestRangeScans() {
  g_test = "range scans";
  const auto simple_out_of_range = [](const std::vector<int32_t>& v, int64_t limit) -> int64_t {
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] < 0 || v[i] >= limit) return static_cast<int64_t>(i);
    }
    return -1;
  };
  const auto simple_decrease = [](const std::vector<int32_t>& v) -> int64_t {
    for (size_t i = 1; i < v.size(); ++i) {
      if (v[i] < v[i - 1]) return static_cast<int64_t>(i);
    }
    return -1;
  };
  std::mt19937 rng(7);
  const int64_t block = sce::kRangeScanBlock;
  for (int64_t n : {int64_t{0}, int64_t{1}, block - 1, block, block + 1, 3 * block + 5}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<int32_t> v(n);
      for (auto& x : v) x = static_cast<int32_t>(rng() % 1000);
      std::sort(v.begin(), v.end());
      if (n > 0 && trial % 4 != 0) {   // plant one or two bad entries
        const int64_t candidates[] = {0, block - 1, block, n - 1,
                                      static_cast<int64_t>(rng() % n)};
        for (int k = 0; k < 1 + trial % 2; ++k) {
          const int64_t at = std::min(n - 1, candidates[rng() % 5]);
          const int kind = static_cast<int>(rng() % 4);
          v[at] = kind == 0 ? -1 : kind == 1 ? 1000 : kind == 2 ? INT32_MIN
                                                              : static_cast<int32_t>(rng() % 1000);
        }
      }
      for (int64_t limit : {int64_t{0}, int64_t{1}, int64_t{999}, int64_t{1000},
                            (int64_t{1} << 31), (int64_t{1} << 40)}) {
        CHECK_EQ(sce::FirstOutOfRange(v.data(), n, limit), simple_out_of_range(v, limit));
      }
      CHECK_EQ(sce::FirstDecrease(v.data(), n), simple_decrease(v));
      for (int32_t previous : {0, 5, -3}) {
        for (int64_t limit : {int64_t{0}, int64_t{1000}, int64_t{1} << 31}) {
          int64_t expected = -1;   // a loop testing each value's range, then its order
          for (int64_t i = 0; i < n && expected < 0; ++i) {
            const int32_t before = i == 0 ? previous : v[i - 1];
            if (v[i] < 0 || v[i] >= limit || v[i] < before) expected = i;
          }
          CHECK_EQ(sce::FirstUnsortedOrOutOfRange(v.data(), n, limit, previous), expected);
        }
      }
    }
  }
  const std::vector<int32_t> top = {0, INT32_MAX, INT32_MAX};
  CHECK_EQ(sce::FirstOutOfRange(top.data(), 3, int64_t{1} << 31), -1);
  CHECK_EQ(sce::FirstOutOfRange(top.data(), 3, INT32_MAX), 1);
  CHECK_EQ(sce::FirstDecrease(top.data(), 3), -1);
}

void TestGroupKeysByOwner() {
  g_test = "key grouping: distinct keys by owner, first appearance kept within an owner";
  // Owners at 4 shards (TestKeyRowMap...: -3 -> 3, 0 -> 2, 1 -> 0, 2 -> 3, 99 -> 2).
  const std::vector<uint64_t> keys = {2, static_cast<uint64_t>(-3), 99, 2, 0, 1,
                                      static_cast<uint64_t>(-3), 2};
  std::vector<int32_t> positions(keys.size(), -7);
  sce::KeysByOwner grouped;
  CHECK_OK(sce::GroupKeysByOwner("table 't'", keys.data(), 8, 4, positions.data(), &grouped));
  CHECK(grouped.keys == (std::vector<uint64_t>{1, 99, 0, 2, static_cast<uint64_t>(-3)}));
  CHECK(grouped.occurrences == (std::vector<int32_t>{1, 1, 1, 3, 2}));
  CHECK(grouped.owner_counts == (std::vector<int32_t>{1, 0, 2, 2}));
  CHECK(positions == (std::vector<int32_t>{3, 4, 1, 3, 2, 0, 4, 3}));
  CHECK_OK(sce::GroupKeysByOwner("table 't'", nullptr, 0, 3, nullptr, &grouped));
  CHECK(grouped.keys.empty() && grouped.owner_counts == (std::vector<int32_t>{0, 0, 0}));

  g_test = "key grouping: equals unique + stable sort by owner on random keys";
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t shards = 1 + static_cast<int64_t>(rng() % 5);
    const int64_t n = static_cast<int64_t>(rng() % 300);
    std::vector<uint64_t> batch(n);
    for (auto& k : batch) k = rng() % 2 ? rng() % 40 : rng();   // repeats and singletons
    std::vector<int32_t> got_positions(n);
    CHECK_OK(sce::GroupKeysByOwner("t", batch.data(), n, shards, got_positions.data(), &grouped));
    std::vector<uint64_t> unique;   // first appearance
    std::map<uint64_t, int32_t> count;
    for (uint64_t k : batch) {
      if (count[k]++ == 0) unique.push_back(k);
    }
    std::vector<uint64_t> want;
    std::vector<int32_t> want_counts(shards, 0);
    for (int64_t s = 0; s < shards; ++s) {
      for (uint64_t k : unique) {
        if (sce::KeyOwnerShard(k, static_cast<int32_t>(shards)) == s) {
          want.push_back(k);
          ++want_counts[s];
        }
      }
    }
    CHECK(grouped.keys == want);
    CHECK(grouped.owner_counts == want_counts);
    bool agree = grouped.occurrences.size() == want.size();
    for (size_t k = 0; agree && k < want.size(); ++k) {
      agree = grouped.occurrences[k] == count[want[k]];
    }
    for (int64_t i = 0; agree && i < n; ++i) agree = want[got_positions[i]] == batch[i];
    CHECK(agree);
  }

  g_test = "key grouping: bad arguments fail naming the table, positions untouched";
  std::vector<int32_t> untouched(2, -7);
  CHECK_ERROR(sce::GroupKeysByOwner("table 'u'", keys.data(), 2, 0, untouched.data(), &grouped),
              "table 'u': num_shards must be in [1, 65536], got 0");
  CHECK_ERROR(sce::GroupKeysByOwner("table 'u'", keys.data(), -1, 2, untouched.data(), &grouped),
              "table 'u': the number of keys must be in");
  CHECK_ERROR(sce::GroupKeysByOwner("table 'u'", nullptr, 2, 2, untouched.data(), &grouped),
              "bad key grouping arguments");
  CHECK(untouched == (std::vector<int32_t>{-7, -7}));

  g_test = "key grouping: every occurrence, counts of 0 skipped, bad counts rejected";
  std::vector<int32_t> repeats = {9};
  const int32_t counts[] = {2, 0, 1, 3};
  CHECK_OK(sce::RepeatIndices("t", counts, 4, &repeats));
  CHECK(repeats == (std::vector<int32_t>{0, 0, 2, 3, 3, 3}));
  CHECK_OK(sce::RepeatIndices("t", nullptr, 0, &repeats));
  CHECK(repeats.empty());
  repeats = {9};
  const int32_t negative[] = {1, -1};
  CHECK_ERROR(sce::RepeatIndices("table 'u'", negative, 2, &repeats),
              "table 'u': counts[1] = -1 is negative");
  const int32_t huge[] = {2147483647, 1};
  CHECK_ERROR(sce::RepeatIndices("table 'u'", huge, 2, &repeats), "sum to more than");
  CHECK(repeats == (std::vector<int32_t>{9}));
}

int main() {
  const std::vector<std::function<void()>> tests = {
      TestConvertToCoo,   TestConvertToListOfCoo, TestSortListOfCoo,
      TestPackCsrFromSortedLists, TestSplitEncoding, TestGetMinibatchSplits,
      TestPackCsrFromMinibatchSplits, TestLayoutStacker,
      TestCheckedMath, TestCsrViewBounds, TestCsrViewIds, TestNonFiniteGradients, TestPreprocessingBounds,
      TestRequireFiniteFeatureGradients, TestRaisePartitionLimits,
      TestShardContributionsAreMergedStably, TestFusedUpdateIsaVersionsAgree,
      TestFusedUpdateMatchesStableSortReference, TestRowWiseAdagradFormula, TestFusedUpdateRowSumBlocks,
      TestHugePageAdvice, TestStableSortByKey,
      TestStableSortWords, TestAdjacentMerge,
      TestFeatureMajorActivations, TestLookupOverwritesActivations, TestLookupIsaVersionsAgree, TestSampleMajorOrder, TestGroupedEntries, TestGroupedEntriesValidation, TestFusedUpdateGradientOrders, TestSplitIdsMatchStableSort,
      TestStackedMinibatchSplits, TestGatheredSegmentSum, TestReplicaChunks, TestIdRouting,
      TestIdRoutingPartitionMaxima, TestOwnerCsr, TestFeatureRowTables,
      TestRowPrecisionConversions, TestStochasticRoundingIsUnbiased, TestLookupOf16BitRows,
      TestNarrowRowUpdate, TestRoundRowIsElementWise, TestKeyRowMapAdmission,
      TestKeyRowMapNumbering, TestKeyRowMapEviction, TestKeyRowMapStateAndErrors,
      TestKeyRowMapMatchesReference, TestKeyRowMapLending, TestKeyRowMapShardsShareCapacity,
      TestKeyRowMapFind, TestKeyedRandomRows, TestStringKeyRowMap, TestRangeScans,
      TestGroupKeysByOwner,
  };
  for (const auto& test : tests) test();
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
