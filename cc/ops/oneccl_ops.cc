// Registration of the oneCCL transport's ops (docs/multi_worker.md#transports). Their kernels are
// in a separate library built against oneCCL when the optional extra is installed
// (cc/kernels/oneccl/, tf_sc_embedding/collectives/oneccl_library.py); without it these ops exist
// but have no kernel, and the library never places them.
#include <string>

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// Rank 0 of a communicator: starts the key-value store the other ranks join; returns its address
// (opaque bytes, handed to every rank by a TensorFlow collective).
REGISTER_OP("SceOnecclCreateStore")
    .Output("address: string")
    .Attr("communicator: string")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape);

// Every rank: forms communicator `communicator` of `size` ranks from the store at `address`,
// waiting at most timeout_seconds (0: forever). peers[r] is rank r's "host:port", named in errors.
REGISTER_OP("SceOnecclConnect")
    .Input("address: string")
    .Attr("communicator: string")
    .Attr("size: int >= 1")
    .Attr("rank: int >= 0")
    .Attr("timeout_seconds: float")
    .Attr("peers: list(string)")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle scalar;
      return c->WithRank(c->input(0), 0, &scalar);
    });

// One collective of a replica over communicator `communicator`, by `kind`:
// - "all_to_all": input [group_size, ...]; row d goes to rank d, output row s came from rank s;
// - "all_gather": every rank's input (equal shapes) concatenated along axis 0 in rank order.
// The ordering token (the replica's collective ordering variable) makes every collective of a
// replica run in program order, which is what keeps the ranks' collectives matched.
REGISTER_OP("SceOnecclCollective")
    .Input("input: T")
    .Input("ordering_token: resource")
    .Output("output: T")
    .Attr("T: {float, bfloat16, half, int32, int64}")
    .Attr("kind: {'all_to_all', 'all_gather'}")
    .Attr("communicator: string")
    .Attr("group_size: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t group_size;
      std::string kind;
      TF_RETURN_IF_ERROR(c->GetAttr("group_size", &group_size));
      TF_RETURN_IF_ERROR(c->GetAttr("kind", &kind));
      ShapeHandle input, output;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &input));
      DimensionHandle rows;
      if (kind == "all_to_all") {
        TF_RETURN_IF_ERROR(c->WithValue(c->Dim(input, 0), group_size, &rows));
      } else {
        TF_RETURN_IF_ERROR(c->Multiply(c->Dim(input, 0), group_size, &rows));
      }
      TF_RETURN_IF_ERROR(c->ReplaceDim(input, 0, rows, &output));
      c->set_output(0, output);
      return absl::OkStatus();
    });

// A ragged all-to-all of a replica over communicator `communicator`: input [group_size, chunk];
// rank d receives the first lengths[d] elements of row d. Output row s holds the
// received_lengths[s] elements rank s sent this rank, then zeros; its width (the longest chunk
// received) is known only when the op runs. The lengths ride in the few bytes the ranks exchange
// before every collective anyway, so a receiver needs no collective of its own to learn them.
REGISTER_OP("SceOnecclRaggedAllToAll")
    .Input("input: T")
    .Input("lengths: int64")
    .Input("ordering_token: resource")
    .Output("output: T")
    .Output("received_lengths: int64")
    .Attr("T: {float, bfloat16, half, int32, int64}")
    .Attr("communicator: string")
    .Attr("group_size: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t group_size;
      TF_RETURN_IF_ERROR(c->GetAttr("group_size", &group_size));
      ShapeHandle input, lengths;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &input));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &lengths));
      DimensionHandle rows;
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(input, 0), group_size, &rows));
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(lengths, 0), group_size, &rows));
      c->set_output(0, c->Matrix(group_size, c->UnknownDim()));
      c->set_output(1, c->Vector(group_size));
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tensorflow
