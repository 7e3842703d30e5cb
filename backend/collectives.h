// Collectives between the ranks of a tensor-parallel job: the operations tensor parallelism
// needs (model/tensor_parallel.h), on memory of the rank's backend (host floats for the CPU
// ranks over MPI, device floats for CUDA ranks over NCCL). A peer that dies or stops
// answering must not hang the caller: every operation waits at most timeout_s, then the
// object is failed() with an error naming what did not answer, and every later operation
// returns at once (its output undefined), so the pass ends and Model::forward reports the
// error.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>

namespace tandem {

// Counters of what the collectives moved: the third roof (the network) of a pass.
struct CollectiveStats {
  uint64_t calls = 0;   // collectives issued
  uint64_t bytes = 0;   // payload bytes (each all-reduce's buffer; each gather's whole output)
  double seconds = 0;   // wall time inside them, waits for slower ranks included
};

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi (2 ranks, tcp,vader)", for reports.
  virtual std::string describe() const = 0;

  // data[0, n) = the sum over ranks of every rank's data[0, n).
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // out[r * n, (r + 1) * n) = rank r's in[0, n), on every rank.
  virtual void all_gather(const float* in, size_t n, float* out) = 0;
  // The same with counts[r] floats from rank r (ranks' shares may differ): rank r's
  // in[0, counts[r]) at out[counts[0] + ... + counts[r - 1]], on every rank.
  virtual void all_gather_v(const float* in, std::span<const size_t> counts, float* out) = 0;
  // bytes of `data` from `root` to every rank (host memory: the batch a step runs).
  // without_limit: wait as long as it takes (rank 0 sends each step within kHeartbeatS, so
  // followers wait with the deadline; nothing in a pass needs this).
  virtual void broadcast(void* data, size_t bytes, int root, bool without_limit = false) = 0;

  // Readable from any thread (a server's HTTP threads refuse work once a rank failed).
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  const std::string& error() const { return error_; }
  const CollectiveStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  // How long one operation may wait for the other ranks (a pass's collectives only wait for
  // the slowest rank's share of the same pass); a follower waiting for the next step waits
  // without a limit (rank 0 decides when work comes).
  double timeout_s = 10.0;
  // One thread at a time issues collectives (MPI_THREAD_SERIALIZED): rank 0 holds this for a
  // whole step (a pass, or the heartbeat's), and MPI_Finalize at exit takes it too.
  std::timed_mutex step_mu;

 protected:
  void fail(std::string why) {
    if (failed()) return;
    error_ = std::move(why);
    failed_.store(true, std::memory_order_release);
  }
  std::string error_;
  std::atomic<bool> failed_{false};
  CollectiveStats stats_;
};

}  // namespace tandem
