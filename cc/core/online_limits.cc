#include "cc/core/online_limits.h"

#include <sstream>

namespace sce {

const char* const kPartitionLimitNames[kNumPartitionLimits] = {"max_ids_per_partition",
                                                               "max_unique_ids_per_partition"};

Status RaisePartitionLimits(int32_t* limits, const int32_t* observed, int64_t num_entries,
                            const std::vector<std::string>& table_names,
                            std::vector<std::string>* changes) {
  const uint64_t tables = table_names.size();
  if (num_entries < 0 || static_cast<uint64_t>(num_entries) != tables * kNumPartitionLimits) {
    return InvalidArgument("the partition limits and statistics must have ", kNumPartitionLimits,
                           " entries per stacked table (", tables, " tables), got ",
                           num_entries);
  }
  if (num_entries > 0 && (limits == nullptr || observed == nullptr)) {
    return InvalidArgument("the partition limits or statistics are missing");
  }
  for (int64_t i = 0; i < num_entries; ++i) {
    if (observed[i] < 0) {
      return InvalidArgument("table '", table_names[i / kNumPartitionLimits], "': ",
                             kPartitionLimitNames[i % kNumPartitionLimits],
                             " statistic must be >= 0, got ", observed[i]);
    }
  }
  for (int64_t i = 0; i < num_entries; ++i) {
    if (observed[i] <= limits[i]) continue;
    std::ostringstream message;
    message << "table '" << table_names[i / kNumPartitionLimits] << "': "
            << kPartitionLimitNames[i % kNumPartitionLimits] << " raised online from "
            << limits[i] << " to " << observed[i]
            << " (the largest value measured on any replica)";
    changes->push_back(message.str());
    limits[i] = observed[i];
  }
  return Status::Ok();
}

}  // namespace sce
