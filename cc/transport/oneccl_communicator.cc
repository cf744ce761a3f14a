#include "cc/transport/oneccl_communicator.h"

#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "oneapi/ccl.hpp"

namespace sce {
namespace oneccl {
namespace {

using Clock = std::chrono::steady_clock;

// While a collective waits, its thread first only yields (a peer a few microseconds behind), then
// sleeps between progress checks so that a peer far behind costs little CPU, and probes the peers'
// servers every kProbeEvery.
constexpr auto kSpinFor = std::chrono::milliseconds(2);
constexpr auto kNap = std::chrono::microseconds(50);
constexpr auto kProbeEvery = std::chrono::seconds(2);
constexpr int kProbeTimeoutMs = 1000;

// Whether a TCP connection to "host:port" opens within kProbeTimeoutMs: a worker's TensorFlow
// server answers as long as the worker lives.
bool Answers(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  if (colon == std::string::npos) return true;   // nothing to probe: assume alive
  std::string host = peer.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port = peer.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return false;
  }
  bool answered = false;
  for (addrinfo* a = found; a != nullptr && !answered; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      answered = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, kProbeTimeoutMs) == 1) {
        int error = 0;
        socklen_t length = sizeof(error);
        answered = getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
      }
    }
    close(fd);
  }
  freeaddrinfo(found);
  return answered;
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kAllToAll: return "all_to_all";
    case Kind::kAllGather: return "all_gather";
    case Kind::kRaggedAllToAll: return "ragged all_to_all";
  }
  return "collective";
}

// How errors name a peer: "rank 1 (host:port)".
std::string RankName(int rank, const std::string& peer) {
  return "rank " + std::to_string(rank) + " (" + peer + ")";
}

class Communicator {
 public:
  Communicator(std::string name, int size, int rank, double timeout_seconds,
               std::vector<std::string> peers, ccl::communicator comm)
      : name_(std::move(name)), size_(size), rank_(rank), timeout_seconds_(timeout_seconds),
        peers_(std::move(peers)), comm_(std::move(comm)) {
    std::thread([this] {
      pthread_setname_np(pthread_self(), "sce_oneccl");   // names it in top, perf and gdb
      Run();
    }).detach();   // lives as long as the process
  }

  void Submit(Collective collective) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(collective));
    ready_.notify_one();
  }

 private:
  void Run() {
    for (;;) {
      Collective next;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return !queue_.empty(); });
        next = std::move(queue_.front());
        queue_.pop_front();
      }
      const Status status = broken_.empty() ? Execute(next) : Unavailable(
          "oneCCL transport: communicator '" + name_ + "' failed earlier and cannot be used "
          "again (" + broken_ + "); restart the worker from its checkpoint");
      // Ranks that disagree on sizes fail alike and stay in step; anything else (a timeout, a
      // peer gone, an error inside oneCCL) leaves the ranks in unknown places.
      if (!status.ok() && status.code() != Code::kInvalidArgument && broken_.empty()) {
        broken_ = status.message();
      }
      next.done(status);
    }
  }

  // What a collective's errors start with (built only when one fails).
  std::string Describe(Kind kind) const {
    return std::string("oneCCL transport: ") + KindName(kind) + " on communicator '" + name_ +
           "' (rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ")";
  }

  Status Execute(const Collective& c) {
    ccl::event event;
    try {
      // Every rank first states what it is about to move (Header): ranks that ran different
      // steps then fail alike with InvalidArgument instead of oneCCL writing past a buffer, and a
      // ragged all-to-all learns what it receives from the same few bytes.
      const std::vector<uint64_t> mine = Header(c);
      const size_t n = mine.size();
      std::vector<uint64_t> all(n * size_);
      event = ccl::allgatherv(mine.data(), n, all.data(), std::vector<size_t>(size_, n),
                              ccl::datatype::uint64, comm_);
      SCE_RETURN_IF_ERROR(Wait(event, c.kind));
      SCE_RETURN_IF_ERROR(CheckHeaders(c, mine, all));
      if (c.kind == Kind::kRaggedAllToAll) return ExecuteRagged(c, all, n);
      if (c.chunk_bytes == 0) return Status::Ok();
      if (c.kind == Kind::kAllToAll) {
        event = ccl::alltoall(c.send, c.receive, c.chunk_bytes, ccl::datatype::int8, comm_);
      } else {
        std::vector<size_t> counts(size_, c.chunk_bytes);
        event = ccl::allgatherv(c.send, c.chunk_bytes, c.receive, counts, ccl::datatype::int8,
                                comm_);
      }
      return Wait(event, c.kind);
    } catch (const std::exception& e) {
      return Unavailable(Describe(c.kind), " failed: ", e.what());
    }
  }

  // [kind, element bytes, chunk (stride) bytes, bytes for rank 0, ..., for rank size - 1].
  static constexpr size_t kLengths = 3;
  std::vector<uint64_t> Header(const Collective& c) const {
    std::vector<uint64_t> header(kLengths + size_, c.chunk_bytes);
    header[0] = static_cast<uint64_t>(c.kind);
    header[1] = c.kind == Kind::kRaggedAllToAll ? c.element_bytes : 1;
    if (c.kind == Kind::kRaggedAllToAll) {
      std::copy(c.send_bytes.begin(), c.send_bytes.end(), header.begin() + kLengths);
    }
    return header;
  }

  // The same checks on every rank, over every rank's header: they fail alike or pass alike.
  Status CheckHeaders(const Collective& c, const std::vector<uint64_t>& mine,
                      const std::vector<uint64_t>& all) const {
    const size_t n = mine.size();
    for (int r = 0; r < size_; ++r) {
      const uint64_t* theirs = all.data() + r * n;
      if (theirs[0] != mine[0] || theirs[1] != mine[1]) {
        const bool known = theirs[0] <= static_cast<uint64_t>(Kind::kRaggedAllToAll);
        return InvalidArgument(Describe(c.kind), ": rank ", r, " runs ",
                               known ? KindName(static_cast<Kind>(theirs[0])) : "another call",
                               " of ", theirs[1], "-byte elements, this rank ", KindName(c.kind),
                               " of ", mine[1], "-byte elements; the ranks ran different steps");
      }
      if (c.kind != Kind::kRaggedAllToAll) {
        if (theirs[2] != mine[2]) {
          return InvalidArgument(Describe(c.kind), ": rank ", r, " moves ", theirs[2],
                                 " bytes per chunk, this rank ", mine[2],
                                 "; the ranks ran different steps");
        }
        continue;
      }
      for (size_t d = 2; d < n; ++d) {
        if (theirs[d] % mine[1] != 0 || (d >= kLengths && theirs[d] > theirs[2])) {
          return InvalidArgument(Describe(c.kind), ": rank ", r, " states ", theirs[d],
                                 " bytes at header entry ", d, " (chunk ", theirs[2],
                                 " bytes): not whole ", mine[1], "-byte elements within a chunk");
        }
      }
    }
    return Status::Ok();
  }

  // oneCCL's alltoallv takes one contiguous buffer each way, chunk d right after chunk d - 1. So
  // every chunk but the last one goes out whole (its padding too: the buffer's stride puts chunk
  // d + 1 there), the last one only as long as it is; the receiver knows every sender's stride
  // from the headers, receives the chunks back to back and spreads them out to its own stride
  // from the last one down (each moves up or stays), zeroing what follows each.
  Status ExecuteRagged(const Collective& c, const std::vector<uint64_t>& all, size_t n) {
    auto sent = [&](int from, int to) -> uint64_t {   // bytes rank `from` puts on the wire to `to`
      const uint64_t* header = all.data() + from * n;
      return to + 1 < size_ ? header[2] : header[kLengths + to];
    };
    std::vector<uint64_t> receive_bytes(size_);
    std::vector<size_t> send_counts(size_), receive_counts(size_);
    uint64_t stride = 0;
    bool moves = false;
    for (int r = 0; r < size_; ++r) {
      receive_bytes[r] = all[r * n + kLengths + rank_];
      receive_counts[r] = sent(r, rank_);
      send_counts[r] = sent(rank_, r);
      stride = std::max<uint64_t>(stride, receive_counts[r]);
      for (int d = 0; d < size_; ++d) moves = moves || sent(r, d) != 0;
    }
    char* receive = nullptr;
    const Status allocated = c.allocate(receive_bytes, stride, &receive);
    if (!allocated.ok()) {   // this rank only: its peers go on to move the bytes
      return Unavailable(Describe(c.kind), ": ", allocated.message());
    }
    if (moves) {
      static char empty;   // oneCCL gets a valid address even when nothing moves
      void* send = c.chunk_bytes ? const_cast<void*>(c.send) : &empty;
      ccl::event event = ccl::alltoallv(send, send_counts, stride ? receive : &empty,
                                        receive_counts, ccl::datatype::int8, comm_);
      SCE_RETURN_IF_ERROR(Wait(event, c.kind));
    }
    if (stride == 0) return Status::Ok();
    std::vector<uint64_t> offsets(size_, 0);
    for (int r = 1; r < size_; ++r) offsets[r] = offsets[r - 1] + receive_counts[r - 1];
    for (int r = size_ - 1; r >= 0; --r) {
      char* chunk = receive + r * stride;
      if (offsets[r] != r * stride) std::memmove(chunk, receive + offsets[r], receive_bytes[r]);
      std::memset(chunk + receive_bytes[r], 0, stride - receive_bytes[r]);
    }
    return Status::Ok();
  }

  // Waits for `event`; on failure the event is abandoned (never destroyed: oneCCL's event
  // destructor waits for completion, which a dead peer never brings).
  Status Wait(ccl::event& event, Kind kind) {
    Status status = WaitOrGiveUp(event, kind);
    if (!status.ok()) new ccl::event(std::move(event));   // leaked on purpose
    return status;
  }

  Status WaitOrGiveUp(ccl::event& event, Kind kind) {
    const auto start = Clock::now();
    auto next_probe = start + kProbeEvery;
    const bool bounded = timeout_seconds_ > 0;
    const auto deadline =
        start + std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(bounded ? timeout_seconds_ : 0.0));
    while (!event.test()) {
      const auto now = Clock::now();
      if (now - start < kSpinFor) {
        sched_yield();
        continue;
      }
      std::this_thread::sleep_for(kNap);
      if (now >= next_probe) {
        next_probe = now + kProbeEvery;
        const std::string gone = PeersGone();
        if (!gone.empty()) {
          return Unavailable(Describe(kind), ": ", gone, " stopped answering while this rank ",
                             "waited for it (the worker died or lost its network)");
        }
      }
      if (bounded && now >= deadline) {
        std::ostringstream message;
        message << Describe(kind) << ": no result after " << timeout_seconds_
                << " s (collective_timeout_seconds); waiting for peers "
                << PeerList() << ", whose TensorFlow servers still answer: a peer is stuck, "
                << "far behind, or running different steps";
        return Unavailable(message.str());
      }
    }
    return Status::Ok();
  }

  std::string PeerList() const {
    std::string list;
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
      if (r == rank_) continue;
      list += (list.empty() ? "" : ", ") + RankName(r, peers_[r]);
    }
    return list;
  }

  std::string PeersGone() const {
    std::string gone;
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
      if (r == rank_ || Answers(peers_[r])) continue;
      gone += (gone.empty() ? "peer " : ", peer ") + RankName(r, peers_[r]);
    }
    return gone;
  }

  const std::string name_;
  const int size_;
  const int rank_;
  const double timeout_seconds_;
  const std::vector<std::string> peers_;
  ccl::communicator comm_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Collective> queue_;
  std::string broken_;   // only touched by the communicator's thread
};

// Process-wide state. Never destroyed: communicator threads run until the process exits, and
// oneCCL's objects must not be torn down under them.
struct Registry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<ccl::kvs>> main_stores;
  std::map<std::string, Communicator*> communicators;
};

Registry& TheRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

void InitializeOnce() {
  static std::once_flag once;
  std::call_once(once, [] { ccl::init(); });
}

}  // namespace

Status CreateMainStore(const std::string& name, std::string* address) {
  try {
    InitializeOnce();
    std::shared_ptr<ccl::kvs> store = ccl::create_main_kvs();
    const ccl::kvs::address_type bytes = store->get_address();
    address->assign(bytes.begin(), bytes.end());
    Registry& registry = TheRegistry();
    std::lock_guard<std::mutex> lock(registry.mutex);
    registry.main_stores[name] = std::move(store);
    return Status::Ok();
  } catch (const std::exception& e) {
    return Unavailable("oneCCL transport: rank 0 could not start the key-value store of "
                       "communicator '", name, "': ", e.what());
  }
}

Status Connect(const std::string& name, int size, int rank, const std::string& address,
               double timeout_seconds, const std::vector<std::string>& peers) {
  if (size < 1 || rank < 0 || rank >= size || static_cast<int>(peers.size()) != size) {
    return InvalidArgument("oneCCL transport: communicator '", name, "' needs 0 <= rank < size ",
                           "and one peer address per rank; got rank ", rank, ", size ", size,
                           ", ", peers.size(), " peer address(es)");
  }
  if (address.size() != ccl::kvs::address_max_size) {
    return InvalidArgument("oneCCL transport: the store address of communicator '", name,
                           "' has ", address.size(), " bytes, expected ",
                           ccl::kvs::address_max_size);
  }
  Registry& registry = TheRegistry();
  std::shared_ptr<ccl::kvs> main_store;
  {
    std::lock_guard<std::mutex> lock(registry.mutex);
    if (registry.communicators.count(name)) {
      return InvalidArgument("oneCCL transport: communicator '", name, "' is already formed");
    }
    auto it = registry.main_stores.find(name);
    if (it != registry.main_stores.end()) main_store = it->second;
  }
  if (rank == 0 && main_store == nullptr) {
    return InvalidArgument("oneCCL transport: rank 0 of communicator '", name,
                           "' must create the store first");
  }
  // Forming a communicator blocks until every rank joined: it runs on its own thread, so that a
  // rank that never comes is an error after the timeout instead of a hang.
  struct Formed {
    std::mutex mutex;
    std::condition_variable done;
    bool finished = false;
    std::string error;
    std::unique_ptr<ccl::communicator> comm;
  };
  auto formed = std::make_shared<Formed>();
  std::thread([formed, main_store, address, size, rank] {
    std::unique_ptr<ccl::communicator> comm;
    std::string error;
    try {
      InitializeOnce();
      std::shared_ptr<ccl::kvs> store = main_store;
      if (store == nullptr) {
        ccl::kvs::address_type bytes;
        std::copy(address.begin(), address.end(), bytes.begin());
        store = ccl::create_kvs(bytes);
      }
      comm = std::make_unique<ccl::communicator>(ccl::create_communicator(size, rank, store));
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::lock_guard<std::mutex> lock(formed->mutex);
    formed->comm = std::move(comm);
    formed->error = error.empty() && formed->comm == nullptr ? "unknown error" : error;
    formed->finished = true;
    formed->done.notify_all();
  }).detach();

  std::unique_lock<std::mutex> lock(formed->mutex);
  auto finished = [&] { return formed->finished; };
  if (timeout_seconds > 0) {
    formed->done.wait_for(lock, std::chrono::duration<double>(timeout_seconds), finished);
  } else {
    formed->done.wait(lock, finished);
  }
  std::ostringstream context;
  context << "oneCCL transport: communicator '" << name << "' of " << size
          << " ranks (this is rank " << rank << ")";
  if (!formed->finished) {
    context << " did not form within " << timeout_seconds << " s; peers:";
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      context << " " << RankName(r, peers[r]) << ": its server "
              << (Answers(peers[r]) ? "answers" : "does not answer") << ";";
    }
    return Unavailable(context.str());
  }
  if (formed->comm == nullptr) {
    return Unavailable(context.str(), " could not form: ", formed->error);
  }
  std::lock_guard<std::mutex> registry_lock(registry.mutex);
  registry.communicators[name] = new Communicator(name, size, rank, timeout_seconds, peers,
                                                  std::move(*formed->comm));
  return Status::Ok();
}

Status Submit(const std::string& name, Collective collective) {
  Registry& registry = TheRegistry();
  Communicator* communicator = nullptr;
  {
    std::lock_guard<std::mutex> lock(registry.mutex);
    auto it = registry.communicators.find(name);
    if (it != registry.communicators.end()) communicator = it->second;
  }
  if (communicator == nullptr) {
    return FailedPrecondition("oneCCL transport: communicator '", name,
                              "' is not formed in this process");
  }
  communicator->Submit(std::move(collective));
  return Status::Ok();
}

}  // namespace oneccl
}  // namespace sce
