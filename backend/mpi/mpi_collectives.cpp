#include "backend/mpi/mpi_collectives.h"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <fmt/core.h>

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;

class MpiCollectives final : public Collectives {
 public:
  MpiCollectives() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return fmt::format("mpi, {} ranks", size_); }

  void all_reduce_sum(float* data, size_t n) override {
    if (failed()) return;
    MPI_Request r;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, data, (int)n, MPI_FLOAT, MPI_SUM, comm_, &r);
    finish(rc, r, n * sizeof(float), "an all-reduce", false);
  }
  void all_gather(const float* in, size_t n, float* out) override {
    if (failed()) return;
    MPI_Request r;
    const int rc = MPI_Iallgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, comm_, &r);
    finish(rc, r, n * sizeof(float) * (size_t)size_, "an all-gather", false);
  }
  void all_gather_v(const float* in, std::span<const size_t> counts, float* out) override {
    if (failed()) return;
    counts_.resize((size_t)size_);
    displs_.resize((size_t)size_);
    size_t total = 0;
    for (size_t r = 0; r < (size_t)size_; r++) {
      counts_[r] = (int)counts[r];
      displs_[r] = (int)total;
      total += counts[r];
    }
    MPI_Request r;
    const int rc = MPI_Iallgatherv(in, counts_[(size_t)rank_], MPI_FLOAT, out, counts_.data(), displs_.data(),
                                   MPI_FLOAT, comm_, &r);
    finish(rc, r, total * sizeof(float), "an all-gather", false);
  }
  void broadcast(void* data, size_t bytes, int root, bool without_limit) override {
    if (failed()) return;
    MPI_Request r;
    const int rc = MPI_Ibcast(data, (int)bytes, MPI_BYTE, root, comm_, &r);
    finish(rc, r, bytes, "a broadcast", without_limit);
  }

 private:
  // Polls the request to its end or the deadline: spinning first (a pass's collectives mostly
  // wait microseconds), then yielding the core for 1 ms (ranks may share cores:
  // --oversubscribe), then sleeping between polls: 100 us, 1 ms past 5 ms, 5 ms past 50 ms (a
  // follower waiting for rank 0's next step or heartbeat: ~300 wakeups a second, under 1% of a
  // core; a step that comes after a pause starts at most 5 ms late).
  void finish(int rc, MPI_Request& r, size_t bytes, const char* what, bool without_limit) {
    const Clock::time_point t0 = Clock::now();
    int done = 0;
    for (long spins = 0; rc == MPI_SUCCESS && !done; spins++) {
      rc = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      if (done || rc != MPI_SUCCESS) break;
      if (spins < 2000) continue;
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      if (waited < 0.001) sched_yield();
      else usleep(waited < 0.005 ? 100 : waited < 0.05 ? 1000 : 5000);
      if (!without_limit && waited > timeout_s) {
        fail(fmt::format("tensor parallel: rank {} waited {:.0f} s in {} of {} bytes for the other {} ranks: one died "
                         "or stopped answering",
                         rank_, timeout_s, what, bytes, size_ - 1));
        return;
      }
    }
    if (rc != MPI_SUCCESS) {
      char msg[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, msg, &len);
      fail(fmt::format("tensor parallel: rank {}: {} failed: {}", rank_, what, std::string(msg, (size_t)len)));
      return;
    }
    stats_.calls++;
    stats_.bytes += bytes;
    stats_.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<int> counts_, displs_;  // all_gather_v's, kept between calls (decode makes 4 a layer)
};

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

std::shared_ptr<Collectives> g_world;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // After a failed collective the peers are gone: finalising would wait for them. A step still
  // going out (exit() called while rank 0's heartbeat runs) must end first: MPI is serialized.
  if (finalized || (g_world && g_world->failed())) return;
  if (g_world && !g_world->step_mu.try_lock_for(std::chrono::seconds(2))) return;
  MPI_Finalize();
}

}  // namespace

bool mpi_built() { return true; }

std::shared_ptr<Collectives> mpi_world() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!launched_by_mpi()) return;
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    std::atexit(finalize_at_exit);
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) g_world = std::make_shared<MpiCollectives>();
  });
  return g_world;
}

}  // namespace tandem
