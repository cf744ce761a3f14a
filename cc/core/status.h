// A tiny status type so the algorithms stay independent of TensorFlow. Kernels translate it into
// tensorflow::errors::InvalidArgument / FailedPrecondition / Unavailable (cc/kernels/status_to_tf.h).
#ifndef SCE_CORE_STATUS_H_
#define SCE_CORE_STATUS_H_

#include <sstream>
#include <string>
#include <utility>

namespace sce {

// kUnavailable: a peer or a transport failed (the oneCCL transport, cc/transport); retrying the
// same call will not help, restarting the workers will.
enum class Code { kOk = 0, kInvalidArgument, kFailedPrecondition, kUnavailable };

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

namespace internal {
inline void Append(std::ostringstream&) {}
template <typename T, typename... Rest>
void Append(std::ostringstream& out, const T& first, const Rest&... rest) {
  out << first;
  Append(out, rest...);
}
}  // namespace internal

template <typename... Args>
Status InvalidArgument(const Args&... args) {
  std::ostringstream out;
  internal::Append(out, args...);
  return Status(Code::kInvalidArgument, out.str());
}

template <typename... Args>
Status FailedPrecondition(const Args&... args) {
  std::ostringstream out;
  internal::Append(out, args...);
  return Status(Code::kFailedPrecondition, out.str());
}

template <typename... Args>
Status Unavailable(const Args&... args) {
  std::ostringstream out;
  internal::Append(out, args...);
  return Status(Code::kUnavailable, out.str());
}

}  // namespace sce

#define SCE_RETURN_IF_ERROR(expr)          \
  do {                                     \
    ::sce::Status _sce_status = (expr);    \
    if (!_sce_status.ok()) return _sce_status; \
  } while (0)

#endif  // SCE_CORE_STATUS_H_
