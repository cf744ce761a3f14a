// Registration of SceAssignRows: writes whole rows of a table or slot variable in place
// (docs/dynamic_vocabulary.md#in-the-training-step). An open-vocabulary table resets the rows it
// gives to new keys, and its scratch row, every step; TensorFlow's scatter ops would switch the
// variable to copy-on-read mode, after which every dense read of it copies the whole table.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// variable[rows[i], :width] = values[i] for every i, in order (a repeated row takes its last
// values); the columns beyond the values' width keep theirs. 16-bit variables take each value
// rounded to nearest. Fails with InvalidArgument naming the table, writing nothing, on a row
// outside the variable or values wider than it.
REGISTER_OP("SceAssignRows")
    .Input("variable: resource")
    .Input("rows: int32")
    .Input("values: float32")
    .Attr("table_name: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle rows, values;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &values));
      shape_inference::DimensionHandle unused;
      return c->Merge(c->Dim(rows, 0), c->Dim(values, 0), &unused);
    });

}  // namespace
}  // namespace tensorflow
