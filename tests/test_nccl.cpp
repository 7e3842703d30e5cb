// The NCCL collectives (backend/nccl) in a job of one rank: with a GPU, an all-reduce, the
// all-gathers and a broadcast through a real communicator (one rank: each is the identity);
// without one, the clear error. Built with CUDA, MPI and NCCL; links NCCL into a test binary.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "backend/nccl/nccl_collectives.h"

namespace tandem {
namespace {

// A world of one rank: what MPI would hand out, without mpirun.
class OneRank final : public Collectives {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "one rank"; }
  void all_reduce_sum(float*, size_t) override {}
  void all_gather(const float* in, size_t n, float* out) override { std::memcpy(out, in, n * sizeof(float)); }
  void all_gather_v(const float* in, std::span<const size_t> n, float* out) override {
    std::memcpy(out, in, n[0] * sizeof(float));
  }
  void broadcast(void*, size_t, int, bool) override {}
};

TEST(NcclCollectives, OneRankJobOrAClearError) {
  OneRank world;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    auto c = nccl_collectives(world, 0, nullptr);
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.error().message.find("no CUDA device"), std::string::npos) << c.error().message;
    GTEST_SKIP() << "no CUDA device: only the error path ran";
  }
  auto c = nccl_collectives(world, 0, nullptr);
  ASSERT_TRUE(c.ok()) << c.error().message;
  std::vector<float> host = {1, 2, 3, 4};
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 2 * host.size() * sizeof(float)), cudaSuccess);
  cudaMemcpy(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
  (*c)->all_reduce_sum(dev, host.size());
  (*c)->all_gather(dev, host.size(), dev + host.size());
  const size_t counts[] = {host.size()};
  (*c)->all_gather_v(dev, counts, dev + host.size());  // one rank: a copy as well
  std::vector<float> back(2 * host.size());
  cudaMemcpy(back.data(), dev, back.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(dev);
  EXPECT_FALSE((*c)->failed()) << (*c)->error();
  EXPECT_EQ(std::vector<float>(back.begin(), back.begin() + 4), host);
  EXPECT_EQ(std::vector<float>(back.begin() + 4, back.end()), host);
  int32_t word = 42;
  (*c)->broadcast(&word, sizeof word, 0);
  EXPECT_EQ(word, 42);
  EXPECT_EQ((*c)->stats().calls, 4u);
}

}  // namespace
}  // namespace tandem
