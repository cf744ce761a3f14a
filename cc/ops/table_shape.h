// The shape of a lookup op's embedding_table input, for the shape functions of the CSR lookup
// (cc/ops/lookup_ops.cc) and the grouped one (cc/ops/grouped_lookup_ops.cc): a rank-2 tensor, or
// a resource variable whose handle's shape is used when it is known.
#ifndef SCE_OPS_TABLE_SHAPE_H_
#define SCE_OPS_TABLE_SHAPE_H_

#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace sce_ops {

inline absl::Status TensorTableShape(shape_inference::InferenceContext* c, int input,
                                     shape_inference::ShapeHandle* table) {
  return c->WithRank(c->input(input), 2, table);
}

inline absl::Status ResourceTableShape(shape_inference::InferenceContext* c, int input,
                                       shape_inference::ShapeHandle* table) {
  *table = c->UnknownShapeOfRank(2);
  auto* handle_data = c->input_handle_shapes_and_types(input);
  if (handle_data != nullptr && handle_data->size() == 1) {
    return c->WithRank((*handle_data)[0].shape, 2, table);
  }
  return absl::OkStatus();
}

// The form the op was registered in: a resource variable, or a tensor.
inline absl::Status TableShape(shape_inference::InferenceContext* c, int input, bool resource,
                               shape_inference::ShapeHandle* table) {
  return resource ? ResourceTableShape(c, input, table) : TensorTableShape(c, input, table);
}

}  // namespace sce_ops
}  // namespace tensorflow

#endif  // SCE_OPS_TABLE_SHAPE_H_
