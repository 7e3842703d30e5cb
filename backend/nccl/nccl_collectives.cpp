#include "backend/nccl/nccl_collectives.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>

#include <chrono>

#include <fmt/core.h>

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(ncclComm_t comm, int rank, int size, int device, cudaStream_t stream)
      : comm_(comm), rank_(rank), size_(size), device_(device), stream_(stream) {}
  ~NcclCollectives() override {
    if (failed())
      ncclCommAbort(comm_);
    else
      ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return fmt::format("nccl {}.{}, {} ranks", NCCL_MAJOR, NCCL_MINOR, size_); }

  void all_reduce_sum(float* data, size_t n) override {
    if (failed()) return;
    const auto t0 = Clock::now();
    check(ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
    wait(t0, n * sizeof(float), "an all-reduce");
  }
  void all_gather(const float* in, size_t n, float* out) override {
    if (failed()) return;
    const auto t0 = Clock::now();
    check(ncclAllGather(in, out, n, ncclFloat32, comm_, stream_), "ncclAllGather");
    wait(t0, n * sizeof(float) * (size_t)size_, "an all-gather");
  }
  // One broadcast per rank's share, grouped: NCCL has no all-gather of uneven counts.
  void all_gather_v(const float* in, std::span<const size_t> counts, float* out) override {
    if (failed()) return;
    const auto t0 = Clock::now();
    size_t at = 0;
    check(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; r++) {
      const float* send = r == rank_ ? in : out + at;  // read on the root only
      check(ncclBroadcast(send, out + at, counts[(size_t)r], ncclFloat32, r, comm_, stream_), "ncclBroadcast");
      at += counts[(size_t)r];
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
    wait(t0, at * sizeof(float), "an all-gather");
  }
  // Host bytes (the step's batch): staged through device memory, as NCCL moves device buffers.
  void broadcast(void* data, size_t bytes, int root, bool without_limit) override {
    if (failed()) return;
    const auto t0 = Clock::now();
    void* dev = nullptr;
    if (cudaMalloc(&dev, bytes) != cudaSuccess) return fail("tensor parallel: cudaMalloc for a broadcast failed");
    if (rank_ == root) cudaMemcpyAsync(dev, data, bytes, cudaMemcpyHostToDevice, stream_);
    check(ncclBroadcast(dev, dev, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
    const double saved = timeout_s;
    if (without_limit) timeout_s = 1e30;
    wait(t0, bytes, "a broadcast");
    timeout_s = saved;
    if (!failed()) cudaMemcpy(data, dev, bytes, cudaMemcpyDeviceToHost);
    cudaFree(dev);
  }

 private:
  void check(ncclResult_t r, const char* what) {
    if (r != ncclSuccess && r != ncclInProgress)
      fail(fmt::format("tensor parallel: rank {}: {} failed: {}", rank_, what, ncclGetErrorString(r)));
  }
  // The stream to the end of the collective, or the deadline: then the communicator is
  // aborted (NCCL's documented way out of a collective a dead peer never completes).
  void wait(Clock::time_point t0, size_t bytes, const char* what) {
    for (long spins = 0; !failed(); spins++) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) return fail(fmt::format("tensor parallel: rank {}: {}: {}", rank_, what, cudaGetErrorString(e)));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        return fail(fmt::format("tensor parallel: rank {}: {}: {}", rank_, what, ncclGetErrorString(async)));
      if (spins > 2000) sched_yield();
      if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s)
        return fail(fmt::format("tensor parallel: rank {} waited {:.0f} s in {} of {} bytes for the other {} ranks: "
                                "one died or stopped answering",
                                rank_, timeout_s, what, bytes, size_ - 1));
    }
    if (failed()) return;
    stats_.calls++;
    stats_.bytes += bytes;
    stats_.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }

  ncclComm_t comm_;
  int rank_, size_, device_;
  cudaStream_t stream_;
};

}  // namespace

Result<std::shared_ptr<Collectives>> nccl_collectives(Collectives& world, int device, void* stream) {
  if (cudaSetDevice(device) != cudaSuccess) return make_error("tensor parallel: no CUDA device {}", device);
  ncclUniqueId id{};
  if (world.rank() == 0 && ncclGetUniqueId(&id) != ncclSuccess) return make_error("ncclGetUniqueId failed");
  world.broadcast(&id, sizeof id, 0);
  if (world.failed()) return make_error("{}", world.error());
  ncclComm_t comm = nullptr;
  if (const ncclResult_t r = ncclCommInitRank(&comm, world.size(), id, world.rank()); r != ncclSuccess)
    return make_error("ncclCommInitRank: {}", ncclGetErrorString(r));
  return std::shared_ptr<Collectives>(
      std::make_shared<NcclCollectives>(comm, world.rank(), world.size(), device, static_cast<cudaStream_t>(stream)));
}

}  // namespace tandem
