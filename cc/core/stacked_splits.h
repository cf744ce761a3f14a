// The stacked COO conversion and the minibatch splits of one stacked table in one call
// (docs/preprocessing.md#one-call-per-stacked-table): what WriteStackedCoo followed by
// GetMinibatchSplits gives, bit for bit, without materializing the stacked COO in between. Each
// feature's merged entries (ConvertFeaturesToStackedCoo) go through the stacking transform
// straight into the sort words of their SparseCore, so the COO is neither written, read back nor
// re-validated id by id.
#ifndef SCE_CORE_STACKED_SPLITS_H_
#define SCE_CORE_STACKED_SPLITS_H_

#include <vector>

#include "cc/core/minibatch_splits.h"
#include "cc/core/parallel.h"
#include "cc/core/stacked_coo.h"
#include "cc/core/status.h"

namespace sce {

// `params.sample_count` is the stacked table's batch: every feature's
// transform.stacked_table_sample_count must equal it, and `params.num_sc_per_chip` must equal the
// features' num_sc_per_chip. Errors name the table and, for a bad id, the feature.
Status GetStackedMinibatchSplits(const std::vector<StackedFeature>& features,
                                 const MinibatchSplitsParams& params, MinibatchSplits* out,
                                 const ParallelFor& parallel_for = RunSerially,
                                 const SplitIdAllocator& allocate = nullptr);

}  // namespace sce

#endif  // SCE_CORE_STACKED_SPLITS_H_
