// Registration of the all-to-all buffer packing of the exchange (docs/multi_worker.md#exchange;
// the algorithm is cc/core/replica_chunks.h).
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// The buffer of a pack op: [counts rows * chunk], from the counts ([W, T]) and chunk (scalar)
// inputs at `first` and `first + 1`.
absl::Status PackedBufferShape(InferenceContext* c, int64_t first) {
  ShapeHandle counts, scalar;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first), 2, &counts));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first + 1), 0, &scalar));
  DimensionHandle chunk, total;
  TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(first + 1, &chunk));
  TF_RETURN_IF_ERROR(c->Multiply(c->Dim(counts, 0), chunk, &total));
  c->set_output(0, c->Vector(total));
  return absl::OkStatus();
}

// buffer[W * chunk]: chunk d holds counts[d, t] entries of values[t] for every t in turn (each
// values[t] sorted by chunk), then zeros. values[t] is [n_t] (ids) or [n_t, width_t] (rows).
REGISTER_OP("ScePackReplicaChunks")
    .Input("values: N * T")
    .Input("counts: int32")
    .Input("chunk: int32")
    .Output("buffer: T")
    .Attr("T: {int32, float}")
    .Attr("N: int >= 1")
    .Attr("label: string = ''")
    .SetShapeFn([](InferenceContext* c) {
      int64_t n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      return PackedBufferShape(c, n);
    });

// The same buffer with values[t] = params[t][indices[t]] (rows of [rows_t, width_t] matrices),
// gathered while packing: the owner side packs rows straight from its variables.
REGISTER_OP("ScePackGatheredReplicaChunks")
    .Input("params: N * T")
    .Input("indices: N * int32")
    .Input("counts: int32")
    .Input("chunk: int32")
    .Output("buffer: T")
    .Attr("T: {int32, float}")
    .Attr("N: int >= 1")
    .Attr("label: string = ''")
    .SetShapeFn([](InferenceContext* c) {
      int64_t n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      ShapeHandle shape;
      for (int64_t t = 0; t < n; ++t) {
        TF_RETURN_IF_ERROR(c->WithRank(c->input(t), 2, &shape));
        TF_RETURN_IF_ERROR(c->WithRank(c->input(n + t), 1, &shape));
      }
      return PackedBufferShape(c, 2 * n);
    });

// The inverse: values[t] gets the counts[d, t] entries of every chunk d, in chunk order, as
// [n_t, widths[t]] (or [n_t] with flat, which needs every width to be 1), then zero entries up to
// a multiple of row_multiples[t] rows (no padding when row_multiples is empty).
REGISTER_OP("SceUnpackReplicaChunks")
    .Input("buffer: T")
    .Input("counts: int32")
    .Output("values: N * T")
    .Attr("T: {int32, float}")
    .Attr("N: int >= 1")
    .Attr("widths: list(int)")
    .Attr("flat: bool = false")
    .Attr("row_multiples: list(int) = []")
    .Attr("label: string = ''")
    .SetShapeFn([](InferenceContext* c) {
      int64_t n;
      std::vector<int64_t> widths;
      bool flat;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("widths", &widths));
      TF_RETURN_IF_ERROR(c->GetAttr("flat", &flat));
      if (static_cast<int64_t>(widths.size()) != n) {
        return absl::InvalidArgumentError(absl::StrCat(
            "SceUnpackReplicaChunks: widths has ", widths.size(), " entries, N is ", n));
      }
      ShapeHandle buffer, counts;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &buffer));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &counts));
      for (int64_t t = 0; t < n; ++t) {
        if (widths[t] < 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "SceUnpackReplicaChunks: widths[", t, "] must be at least 1, got ", widths[t]));
        }
        c->set_output(t, flat ? c->Vector(c->UnknownDim())
                              : c->Matrix(c->UnknownDim(), widths[t]));
      }
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tensorflow
