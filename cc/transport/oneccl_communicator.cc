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

const char* KindName(Kind kind) { return kind == Kind::kAllToAll ? "all_to_all" : "all_gather"; }

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
      // Every rank must move the same number of bytes per chunk, or oneCCL would write past a
      // receive buffer: the sizes are compared first (8 bytes from each rank).
      std::vector<uint64_t> sizes(size_);
      const uint64_t mine = c.chunk_bytes;
      event = ccl::allgatherv(&mine, 1, sizes.data(), std::vector<size_t>(size_, 1),
                              ccl::datatype::uint64, comm_);
      SCE_RETURN_IF_ERROR(Wait(event, c.kind));
      for (int r = 0; r < size_; ++r) {
        if (sizes[r] != mine) {
          return InvalidArgument(Describe(c.kind), ": rank ", r, " moves ", sizes[r],
                                 " bytes per chunk, ",
                                 "this rank ", mine, "; the ranks ran different steps");
        }
      }
      if (mine == 0) return Status::Ok();
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
