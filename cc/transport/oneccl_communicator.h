// The oneCCL transport of the embedding's collectives (docs/multi_worker.md#transports), free of
// TensorFlow: the kernels in cc/kernels/oneccl/ adapt it.
//
// One communicator per embedding and worker process (one rank per process). Each communicator has
// one thread that runs its collectives one after another in the order they were submitted: the
// kernels submit them in program order (the ordering token serializes them), which is the same on
// every worker, so the ranks always meet in the same collective. The thread drives oneCCL's
// progress itself (CCL_WORKER_OFFLOAD=0) and never blocks a TensorFlow thread.
//
// A collective that does not complete within the communicator's timeout, or whose peer's
// TensorFlow server stops answering while it waits, fails with an error naming the transport and
// the peer; the communicator is then broken and every later collective on it fails at once (the
// worker must restart from its checkpoint, as with TensorFlow's own collectives).
#ifndef SCE_TRANSPORT_ONECCL_COMMUNICATOR_H_
#define SCE_TRANSPORT_ONECCL_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cc/core/status.h"

namespace sce {
namespace oneccl {

enum class Kind { kAllToAll, kAllGather, kRaggedAllToAll };

// Where a ragged all-to-all's received chunks go: called on the communicator's thread once the
// ranks told each other their lengths, with receive_bytes[s] = the bytes rank s sends this rank
// and the stride the chunks need; returns a buffer of size() * receive_stride bytes, where chunk
// s lands at s * receive_stride followed by zeros. An error fails this rank only and breaks the
// communicator (its peers' collective then times out).
using AllocateReceive = std::function<Status(const std::vector<uint64_t>& receive_bytes,
                                             size_t receive_stride, char** receive)>;

// One collective of bytes:
// - all_to_all sends bytes [d * chunk, (d + 1) * chunk) of `send` to rank d and receives rank s's
//   chunk at [s * chunk, ...);
// - all_gather sends its `chunk` bytes to every rank and receives rank s's at [s * chunk, ...);
// - ragged all_to_all sends the first send_bytes[d] bytes at send + d * chunk to rank d (lengths
//   differ by destination and by rank; at most chunk) and receives where `allocate` says.
// `done` runs on the communicator's thread.
struct Collective {
  Kind kind;
  const void* send;
  void* receive;
  size_t chunk_bytes;
  std::function<void(const Status&)> done;
  std::vector<uint64_t> send_bytes;   // ragged only: one length per rank
  uint64_t element_bytes = 1;         // ragged only: every length is a multiple of it
  AllocateReceive allocate;           // ragged only
};

// Rank 0: starts the key-value store the other ranks join, and returns its address (bytes).
Status CreateMainStore(const std::string& name, std::string* address);

// Every rank: joins the store at `address` and forms communicator `name` of `size` ranks, waiting
// at most `timeout_seconds` for the others. peers[r] names rank r ("host:port" of its TensorFlow
// server) in errors, and is probed while a collective waits. Forming a name twice is an error.
Status Connect(const std::string& name, int size, int rank, const std::string& address,
               double timeout_seconds, const std::vector<std::string>& peers);

// Queues a collective on communicator `name` (formed by Connect in this process).
Status Submit(const std::string& name, Collective collective);

}  // namespace oneccl
}  // namespace sce

#endif  // SCE_TRANSPORT_ONECCL_COMMUNICATOR_H_
