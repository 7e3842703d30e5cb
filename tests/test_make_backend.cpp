// Choosing a backend by name: the CPU always; "cuda" only in a CUDA build on a machine with a
// GPU, else a clear error; "auto" falls back to the CPU.
#include <gtest/gtest.h>

#include "backend/make_backend.h"
#include "tiny_model.h"

namespace tandem {
namespace {

TEST(MakeBackend, CpuWithItsOptions) {
  BackendChoice c;
  c.device = "cpu";
  c.threads = 1;
  c.isa = "scalar";
  c.quantized_activations = false;
  auto be = make_backend(c);
  ASSERT_TRUE(be.ok()) << be.error().message;
  EXPECT_EQ(be.value()->describe(), "cpu scalar, 1 threads, f32 activations");
}

// --exact-products: a list, none, or auto (the head of a small model whose head is at most a
// third of its parameters).
TEST(MakeBackend, ExactProductsForTheOption) {
  const auto small_head = test::tiny_model_file(test::TinyShape{});  // a 96-token head, ~7% of it
  test::TinyShape big;
  big.n_vocab = 2048;  // the head (and the embedding) ~39% of the parameters
  const auto big_head = test::tiny_model_file(big);
  using Names = std::vector<std::string>;
  EXPECT_EQ(exact_products_for("auto", *small_head), (Names{"output", "token_embd"}));
  EXPECT_EQ(exact_products_for("auto", *big_head), Names{});
  EXPECT_EQ(exact_products_for("none", *small_head), Names{});
  EXPECT_EQ(exact_products_for("output,ffn_down", *big_head), (Names{"output", "ffn_down"}));
  EXPECT_EQ(exact_products_for(",output,,", *big_head), Names{"output"});  // empty names dropped
}

TEST(MakeBackend, UnknownDeviceOrIsaIsAnError) {
  BackendChoice c;
  c.device = "tpu";
  auto be = make_backend(c);
  ASSERT_FALSE(be.ok());
  EXPECT_NE(be.error().message.find("unknown device 'tpu'"), std::string::npos);
  c.device = "cpu";
  c.isa = "sse9";
  be = make_backend(c);
  ASSERT_FALSE(be.ok());
  EXPECT_NE(be.error().message.find("sse9"), std::string::npos);
}

TEST(MakeBackend, CudaIsAClearErrorWithoutBuildOrGpu) {
  BackendChoice c;
  c.device = "cuda";
  auto be = make_backend(c);
  auto gpu = probe_gpu(0);
  if (!cuda_built()) {
    ASSERT_FALSE(be.ok());
    EXPECT_NE(be.error().message.find("built without CUDA"), std::string::npos) << be.error().message;
    EXPECT_FALSE(gpu.ok());
  } else if (!gpu.ok()) {
    ASSERT_FALSE(be.ok());
    EXPECT_NE(be.error().message.find("no CUDA device"), std::string::npos) << be.error().message;
  } else {
    ASSERT_TRUE(be.ok()) << be.error().message;
    EXPECT_EQ(be.value()->describe().rfind("cuda ", 0), 0u) << be.value()->describe();
  }
}

TEST(MakeBackend, AutoIsTheGpuWhenThereIsOneElseTheCpu) {
  BackendChoice c;  // device "auto"
  c.threads = 1;
  auto be = make_backend(c);
  ASSERT_TRUE(be.ok()) << be.error().message;
  const bool gpu = cuda_built() && probe_gpu(0).ok();
  EXPECT_EQ(be.value()->describe().rfind(gpu ? "cuda " : "cpu ", 0), 0u) << be.value()->describe();
}

TEST(MakeBackend, GpuProbeDescribesTheDevice) {
  auto g = probe_gpu(0);
  if (!g.ok()) GTEST_SKIP() << "no GPU to probe: " << g.error().message;
  EXPECT_FALSE(g->name.empty());
  EXPECT_GT(g->sm_count, 0);
  EXPECT_GT(g->memory_total, 0u);
  EXPECT_LE(g->memory_free, g->memory_total);
}

}  // namespace
}  // namespace tandem
