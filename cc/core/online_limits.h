// Online adaptation of the SparseCore partition limits (docs/preprocessing.md#online-limits).
//
// Each stacked table has two limits, max ids and max unique ids per partition. A step's measured
// statistics, agreed over every replica, raise a limit that they exceed to the measured value;
// limits never go down. The TF-free part: apply the raise and describe every change.
#ifndef SCE_CORE_ONLINE_LIMITS_H_
#define SCE_CORE_ONLINE_LIMITS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/status.h"

namespace sce {

// The two limits of a table, in this order, in `limits` and `observed` ([num_tables, 2]).
constexpr int kNumPartitionLimits = 2;
extern const char* const kPartitionLimitNames[kNumPartitionLimits];

// limits[i] = max(limits[i], observed[i]) for the 2 * table_names.size() entries; appends one
// message per raised limit to `changes` (table, limit, old and new value). Negative observed
// values are an error (statistics are counts), and nothing is changed then.
Status RaisePartitionLimits(int32_t* limits, const int32_t* observed, int64_t num_entries,
                            const std::vector<std::string>& table_names,
                            std::vector<std::string>* changes);

}  // namespace sce

#endif  // SCE_CORE_ONLINE_LIMITS_H_
