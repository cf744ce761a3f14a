// The TensorFlow status of a cc/core status. Header-only, so that kernel libraries built apart
// from the op library (the oneCCL transport's, cc/kernels/oneccl) translate statuses the same way.
#ifndef SCE_KERNELS_STATUS_TO_TF_H_
#define SCE_KERNELS_STATUS_TO_TF_H_

#include "absl/status/status.h"
#include "cc/core/status.h"

namespace tensorflow {
namespace sce_kernels {

inline absl::Status ToTf(const sce::Status& status) {
  switch (status.code()) {
    case sce::Code::kOk:
      return absl::OkStatus();
    case sce::Code::kFailedPrecondition:
      return absl::FailedPreconditionError(status.message());
    case sce::Code::kUnavailable:
      return absl::UnavailableError(status.message());
    case sce::Code::kInvalidArgument:
    default:
      return absl::InvalidArgumentError(status.message());
  }
}

}  // namespace sce_kernels
}  // namespace tensorflow

#endif  // SCE_KERNELS_STATUS_TO_TF_H_
