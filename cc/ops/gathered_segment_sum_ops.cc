// Registration of the weighted gather + segment sum of the all-to-all exchange
// (docs/multi_worker.md#exchange; the algorithm is cc/core/gathered_segment_sum.h).
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// The positions, gains and segment_ids inputs (`first` to `first + 2`): vectors of one length.
absl::Status EntryVectors(InferenceContext* c, int64_t first) {
  ShapeHandle entries;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first), 1, &entries));
  for (int64_t i = first + 1; i <= first + 2; ++i) {
    ShapeHandle other;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &other));
    TF_RETURN_IF_ERROR(c->Merge(entries, other, &entries));
  }
  return absl::OkStatus();
}

// output[segment_ids[i]] += gains[i] * rows[positions[i]]; output is [num_segments, width of rows]
// and starts at zero. Its gradient with respect to rows is the same op with positions and
// segment_ids swapped (registered in tf_sc_embedding/ops/segment_sum.py).
REGISTER_OP("SceGatheredSegmentSum")
    .Input("rows: float")
    .Input("positions: int32")
    .Input("gains: float")
    .Input("segment_ids: int32")
    .Input("num_segments: int32")
    .Output("output: float")
    .Attr("table_name: string = ''")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle rows, scalar;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      TF_RETURN_IF_ERROR(EntryVectors(c, 1));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 0, &scalar));
      DimensionHandle segments;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(4, &segments));
      c->set_output(0, c->Matrix(segments, c->Dim(rows, 1)));
      return absl::OkStatus();
    });

// The same sum for the exchange's activations, held as one matrix per feature
// (docs/lookup.md#activation-row-order). Segment ids (ToFeatures) or positions (FromFeatures)
// are stacked rows s * M + start_f + k, where M = sum(feature_rows_per_sc) and feature f starts
// at start_f in each SparseCore's M rows; that row is row s * feature_rows_per_sc[f] + k of
// feature f's [sparse_cores * feature_rows_per_sc[f], width] matrix.
//
// ToFeatures: rows -> activations, written straight into one output per feature. With one
// row_indices vector (K = 1), position p reads rows[row_indices[p]]: a lookup reads the unique
// rows of an id list in place in the table instead of gathering a copy of them first.
REGISTER_OP("SceGatheredSegmentSumToFeatures")
    .Input("rows: float")
    .Input("positions: int32")
    .Input("gains: float")
    .Input("segment_ids: int32")
    .Input("row_indices: K * int32")
    .Output("activations: N * float")
    .Attr("N: int >= 1")
    .Attr("K: int >= 0 = 0")
    .Attr("sparse_cores: int >= 1")
    .Attr("feature_rows_per_sc: list(int)")
    .Attr("table_name: string = ''")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      TF_RETURN_IF_ERROR(EntryVectors(c, 1));
      int64_t n, cores;
      std::vector<int64_t> rows_per_sc;
      std::string table;
      TF_RETURN_IF_ERROR(c->GetAttr("table_name", &table));
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("sparse_cores", &cores));
      TF_RETURN_IF_ERROR(c->GetAttr("feature_rows_per_sc", &rows_per_sc));
      int64_t k;
      TF_RETURN_IF_ERROR(c->GetAttr("K", &k));
      if (k > 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "SceGatheredSegmentSumToFeatures, table '", table, "': at most one row_indices "
            "vector, got ", k));
      }
      for (int64_t i = 0; i < k; ++i) {
        ShapeHandle indices;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(4 + i), 1, &indices));
      }
      if (static_cast<int64_t>(rows_per_sc.size()) != n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "SceGatheredSegmentSumToFeatures, table '", table, "': feature_rows_per_sc has ",
            rows_per_sc.size(), " entries, N is ", n));
      }
      for (int64_t f = 0; f < n; ++f) {
        if (rows_per_sc[f] < 0 || rows_per_sc[f] > (int64_t{1} << 31) / cores) {
          return absl::InvalidArgumentError(absl::StrCat(
              "SceGatheredSegmentSumToFeatures, table '", table, "': feature_rows_per_sc[", f,
              "] = ", rows_per_sc[f], " is out of range"));
        }
        c->set_output(f, c->Matrix(cores * rows_per_sc[f], c->Dim(rows, 1)));
      }
      return absl::OkStatus();
    });

// FromFeatures: activation gradients, one input per feature, -> [num_segments, width].
REGISTER_OP("SceGatheredSegmentSumFromFeatures")
    .Input("gradients: N * float")
    .Input("positions: int32")
    .Input("gains: float")
    .Input("segment_ids: int32")
    .Input("num_segments: int32")
    .Output("output: float")
    .Attr("N: int >= 1")
    .Attr("sparse_cores: int >= 1")
    .Attr("feature_rows_per_sc: list(int)")
    .Attr("table_name: string = ''")
    .SetShapeFn([](InferenceContext* c) {
      int64_t n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      ShapeHandle gradient, scalar;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &gradient));
      TF_RETURN_IF_ERROR(EntryVectors(c, n));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(n + 3), 0, &scalar));
      DimensionHandle segments;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(n + 3, &segments));
      c->set_output(0, c->Matrix(segments, c->Dim(gradient, 1)));
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tensorflow
