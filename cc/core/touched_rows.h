// The rows a fused update writes, as flags: what a delta export (docs/deltas.md) must send.
//
// A fused update of a CSR view writes every row of the table given that a valid (non-padding)
// entry of a local shard references, and no other. Marking exactly those rows, from the same
// view and with the same segment walk, keeps one definition of "the rows a step changed": the
// view's. A row the update skips for a non-finite gradient (non_finite_gradients="skip") is
// marked as well; a delta that carries a row unchanged is still exact, since it carries values.
#ifndef SCE_CORE_TOUCHED_ROWS_H_
#define SCE_CORE_TOUCHED_ROWS_H_

#include <cstdint>

#include "cc/core/csr_view.h"
#include "cc/core/status.h"

namespace sce {

// Sets flags[row] = 1 for every row of the table given (view.table_rows of them) that a valid
// entry of a local shard references; other flags keep their values. The view must have passed
// ValidateCsrView. Fails with InvalidArgument naming the table, writing nothing, when num_flags
// is not the table's row count.
Status MarkTouchedRows(const CsrView& view, uint8_t* flags, int64_t num_flags);

}  // namespace sce

#endif  // SCE_CORE_TOUCHED_ROWS_H_
