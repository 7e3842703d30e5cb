#include "backend/mpi/mpi_peer_link.h"

#include <mpi.h>

#include <list>
#include <mutex>
#include <unordered_map>

#include <fmt/core.h>

#include "backend/mpi/mpi_collectives.h"

namespace tandem {

namespace {

constexpr int kControlTag = 71, kPayloadTag = 72;

class MpiPeerLink final : public PeerLink {
 public:
  MpiPeerLink() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return fmt::format("mpi point-to-point, {} ranks", size_); }

  void send(int to, std::vector<uint8_t> bytes) override {
    std::lock_guard<std::mutex> l(mu_);
    test_control_sends();
    ControlSend& c = control_sends_.emplace_back();
    c.bytes = std::move(bytes);
    if (MPI_Isend(c.bytes.data(), (int)c.bytes.size(), MPI_BYTE, to, kControlTag, comm_, &c.request) != MPI_SUCCESS)
      control_sends_.pop_back();  // a dead peer: nothing to wait for
  }

  std::optional<PeerMessage> receive(int from) override {
    std::lock_guard<std::mutex> l(mu_);
    test_control_sends();
    int arrived = 0;
    MPI_Status st;
    if (MPI_Iprobe(from, kControlTag, comm_, &arrived, &st) != MPI_SUCCESS || !arrived) return std::nullopt;
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    PeerMessage m{from, std::vector<uint8_t>((size_t)n)};
    // The message has arrived whole (probed), so this receive returns at once.
    if (MPI_Recv(m.bytes.data(), n, MPI_BYTE, from, kControlTag, comm_, MPI_STATUS_IGNORE) != MPI_SUCCESS) return std::nullopt;
    return m;
  }

  Handle send_payload(int to, const void* data, size_t bytes) override {
    std::lock_guard<std::mutex> l(mu_);
    MPI_Request r;
    if (MPI_Isend(data, (int)bytes, MPI_BYTE, to, kPayloadTag, comm_, &r) != MPI_SUCCESS) return 0;
    stats_.payloads_sent++, stats_.payload_bytes_sent += bytes;
    return add(r, bytes, false);
  }

  Handle receive_payload(int from, void* data, size_t bytes) override {
    std::lock_guard<std::mutex> l(mu_);
    MPI_Request r;
    if (MPI_Irecv(data, (int)bytes, MPI_BYTE, from, kPayloadTag, comm_, &r) != MPI_SUCCESS) return 0;
    return add(r, bytes, true);
  }

  bool done(Handle h) override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = payloads_.find(h);
    if (it == payloads_.end()) return true;
    int complete = 0;
    if (MPI_Test(&it->second.request, &complete, MPI_STATUS_IGNORE) != MPI_SUCCESS || !complete) return false;
    if (it->second.receive) stats_.payloads_received++, stats_.payload_bytes_received += it->second.bytes;
    payloads_.erase(it);
    return true;
  }

  bool cancel_receive(Handle h) override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = payloads_.find(h);
    if (it == payloads_.end()) return true;
    MPI_Request& r = it->second.request;
    MPI_Cancel(&r);
    int complete = 0;
    // A cancelled receive that no sender had matched completes at once.
    if (MPI_Test(&r, &complete, MPI_STATUS_IGNORE) != MPI_SUCCESS || !complete) return false;
    payloads_.erase(it);
    return true;  // cancelled, or it had landed whole: either way nothing more is written
  }

  void progress() override {
    std::lock_guard<std::mutex> l(mu_);
    test_control_sends();
  }

  PeerLinkStats stats() const override {
    std::lock_guard<std::mutex> l(mu_);
    return stats_;
  }

 private:
  struct ControlSend {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<uint8_t> bytes;  // kept until the send completes
  };
  struct Payload {
    MPI_Request request = MPI_REQUEST_NULL;
    size_t bytes = 0;
    bool receive = false;
  };

  Handle add(MPI_Request r, size_t bytes, bool receive) {
    const Handle h = next_++;
    payloads_.emplace(h, Payload{r, bytes, receive});
    return h;
  }
  void test_control_sends() {  // under mu_
    for (auto it = control_sends_.begin(); it != control_sends_.end();) {
      int complete = 0;
      const int rc = MPI_Test(&it->request, &complete, MPI_STATUS_IGNORE);
      it = rc == MPI_SUCCESS && complete ? control_sends_.erase(it) : std::next(it);
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  mutable std::mutex mu_;
  std::list<ControlSend> control_sends_;  // a list: each buffer stays where MPI was told it is
  std::unordered_map<Handle, Payload> payloads_;
  Handle next_ = 1;
  PeerLinkStats stats_;
};

}  // namespace

std::unique_ptr<PeerLink> mpi_peer_link() {
  if (!mpi_world()) return nullptr;  // initialises MPI under mpirun; null for a job of one
  return std::make_unique<MpiPeerLink>();
}

}  // namespace tandem
