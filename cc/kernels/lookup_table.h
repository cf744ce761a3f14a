// The table a forward lookup reads (the CSR lookup and the grouped one): a float32, bfloat16 or
// float16 matrix, given as a tensor or read in place from a resource variable. One home for the
// check of its type and rank and for the choice of the row type the core loops are built for.
#ifndef SCE_KERNELS_LOOKUP_TABLE_H_
#define SCE_KERNELS_LOOKUP_TABLE_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "cc/core/row_precision.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace tensorflow {
namespace sce_kernels {

// Ok for a matrix of float32, bfloat16 or float16 rows (16-bit rows are read as float32);
// otherwise InvalidArgument naming the table.
inline absl::Status CheckLookupTable(const Tensor& table, const std::string& table_name) {
  const DataType dtype = table.dtype();
  if (table.dims() == 2 && (dtype == DT_FLOAT || dtype == DT_BFLOAT16 || dtype == DT_HALF)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "table '", table_name, "': embedding_table must be a float32, bfloat16 or float16 matrix, ",
      "got ", DataTypeString(dtype), " ", table.shape().DebugString()));
}

// Calls fn(rows) with the table's rows as `const float*`, `const sce::Bfloat16*` or
// `const sce::Float16*`. `table` must have passed CheckLookupTable.
template <typename Fn>
void WithTableRows(const Tensor& table, Fn&& fn) {
  const void* rows = table.tensor_data().data();
  if (table.dtype() == DT_BFLOAT16) {
    fn(static_cast<const sce::Bfloat16*>(rows));
  } else if (table.dtype() == DT_HALF) {
    fn(static_cast<const sce::Float16*>(rows));
  } else {
    fn(static_cast<const float*>(rows));
  }
}

}  // namespace sce_kernels
}  // namespace tensorflow

#endif  // SCE_KERNELS_LOOKUP_TABLE_H_
