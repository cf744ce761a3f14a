// Registration of the weighted gather + segment sum of the all-to-all exchange
// (docs/multi_worker.md#exchange; the algorithm is cc/core/gathered_segment_sum.h).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

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
      ShapeHandle rows, entries, scalar;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &entries));
      for (int i = 2; i <= 3; ++i) {
        ShapeHandle other;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &other));
        TF_RETURN_IF_ERROR(c->Merge(entries, other, &entries));
      }
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 0, &scalar));
      DimensionHandle segments;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(4, &segments));
      c->set_output(0, c->Matrix(segments, c->Dim(rows, 1)));
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tensorflow
