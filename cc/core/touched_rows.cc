#include "cc/core/touched_rows.h"

#include "cc/core/constants.h"

namespace sce {

Status MarkTouchedRows(const CsrView& view, uint8_t* flags, int64_t num_flags) {
  if (num_flags != view.table_rows) {
    return InvalidArgument("table '", view.table_name, "': the touched-row flags hold ", num_flags,
                           " rows, the table given ", view.table_rows);
  }
  const int64_t rows_per_shard = view.rows_per_shard();
  const int64_t first = view.first_local_shard;
  for (int64_t sc = 0; sc < view.num_source_sparse_cores(); ++sc) {
    for (int64_t b = 0; b < view.num_minibatches; ++b) {
      for (int64_t p = first; p < first + view.local_shards(); ++p) {
        int64_t begin, end;
        view.Segment(sc, b, p, &begin, &end);
        const int64_t base = (p - first) * rows_per_shard;
        for (int64_t i = begin; i < end; ++i) {
          const int32_t token = view.token_ids[i];
          if (token == kPad || view.sample_ids[i] == kPad) continue;
          flags[base + token] = 1;   // in range: ValidateCsrView checked every valid token
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace sce
