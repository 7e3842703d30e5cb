// The CPU backend: the forward pass's ops on host memory, by the kernels of kernels/cpu at one
// ISA level, on a thread team of its own size (cpu::WorkTeam). The thread count is this
// object's, not the process's: run_pass makes its team the calling thread's for the length of
// the pass, so two backends (or a serving thread and the main thread) each get theirs.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/work_team.h"

namespace tandem {

namespace cpu {
struct BoundedHead;
struct WeightMatrix;
}  // namespace cpu

struct CpuBackendOptions {
  cpu::Isa isa = cpu::best_isa();
  int threads = 0;  // 0: OpenMP's default (OMP_NUM_THREADS, else every core)
  // 8-bit activations for the quant types' weights (kernels/cpu/quant_dot.h: Q4_0 .. Q6_K,
  // MXFP4; llama.cpp's numerics, faster); false keeps every product in float, which reference
  // checks use.
  bool quantized_activations = true;
  // With 8-bit activations, the products of weights named by one of these still run on f32
  // activations: the few that cost the most accuracy for their share of the time (tandem
  // perplexity --kl-divergence measures it). A pattern names whole dot-separated parts of a
  // tensor name: "output" is output.weight (not attn_output.weight), "ffn_down" every layer's.
  std::vector<std::string> exact_products = {};
};

// True when `pattern` is a run of whole dot-separated components of `name`.
bool name_has_components(std::string_view name, std::string_view pattern);

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& o = {});

  cpu::Isa isa() const { return kernels_.isa; }
  int threads() const { return threads_; }
  bool quantized_activations() const { return kernels_.quantized_activations; }
  const cpu::CpuKernels& kernels() const { return kernels_; }

  std::string describe() const override;
  Tensor new_tensor(int64_t rows, int64_t cols) override;
  Tensor upload(std::span<const float> host, int64_t rows, int64_t cols) override;
  std::span<const float> read(const Tensor& t) override;
  Result<KvStore> new_kv_store(DType dtype, int n_layer, int block_tokens, int64_t n_blocks, size_t row_bytes) override;
  bool kv_layer_groups() const override { return true; }
  Result<Weight> prepare_weight(const WeightSource& src, bool products) override;
  Result<Tensor> prepare_vector(const WeightSource& src) override;

  void run_pass(int64_t n_tokens, const std::function<void()>& body) override;
  void embed(const Weight& table, const ForwardBatch& b, const Tensor& out, float scale) override;
  void matmul(std::span<const Product> group, const Tensor& in) override;
  void rmsnorm(const Tensor& x, const Tensor& weight, const Tensor& out, float eps, int head_dim = 0) override;
  void add_residual(const Tensor& x, const Tensor& delta, const Tensor* norm, const Tensor* out, float eps,
                    float delta_scale) override;
  void rope_angles(const ForwardBatch& b, std::span<const double> inv_freq, int rope_dim, const Tensor& out) override;
  void rope(const Tensor& q, const Tensor& k, const Tensor& angles, const HeadShape& h, int rope_dim,
            RopeStyle style) override;
  void gated_activation(const Tensor& gate, const Tensor& up, GateActivation act) override;
  void store_kv(const Tensor& k, const Tensor& v, const KvStore& kv, int layer, const ForwardBatch& b) override;
  void attention(const Tensor& q, const KvStore& kv, int layer, const ForwardBatch& b, const HeadShape& h,
                 const AttentionParams& p, const Tensor& out) override;
  void logits(const Tensor& x, std::span<const int64_t> rows, const Tensor& norm, float eps, const Weight& w,
              const Tensor& scratch, const Tensor& out, const LogitsParams& p) override;
  bool runs_moe() const override { return true; }
  MoeCounts moe_counts() const override { return moe_counts_; }
  double attention_seconds() const override { return attention_s_; }
  void moe_route(const Tensor& router_logits, const MoeRouting& r, const Tensor& routes) override;
  void moe_ffn(const Tensor& x, const Tensor& routes, int n_used, const ExpertWeights& e, GateActivation act,
               const Tensor& out) override;
  bool runs_tensor_parallel() const override { return true; }
  void embed_shard(const Weight& table, int64_t first_row, const ForwardBatch& b, const Tensor& out,
                   float scale) override;
  void gather_columns(const Tensor& part, const Tensor& out, std::span<const int64_t> cols, Collectives& c) override;

 private:
  // Runs f(row) for rows [0, n): on the calling thread for a few rows (too little work to
  // share), otherwise split over the team.
  template <typename F>
  void each_row(int64_t n, F f);
  // Work too small to share at any row count (a row's embedding lookup, RoPE angles, the K,V
  // store): on the calling thread.
  template <typename F>
  void few_rows(int64_t n, F f);
  // The team the passes and load-time packing share work on (made when first needed).
  cpu::WorkTeam& team();
  // w's 8-bit twin for argmax-only logit rows (kernels/cpu/bounded_head.h), or null.
  const cpu::BoundedHead* bounded_head(const cpu::WeightMatrix& w) const;

  cpu::CpuKernels kernels_;
  cpu::CpuKernels exact_kernels_;  // f32 activations, for exact_products
  std::vector<std::string> exact_products_;
  int threads_ = 1;
  std::unique_ptr<cpu::WorkTeam> team_;  // see team()
  // gather_columns' rank-major blocks and counts, kept between calls (4 gathers a layer).
  std::vector<float> gathered_;
  // One expert's buffers: its gathered input rows, gate and up (the activation lands in gate),
  // and its gate-of-output's products.
  struct ExpertBuffers {
    std::vector<float> in, gate, up, scale;
  };
  // moe_ffn's rows of each expert, (row, weight); the experts chosen and where each one's
  // output rows start in ys: kept between calls, so a decode step does not allocate.
  struct MoeScratch {
    std::vector<std::vector<std::pair<int64_t, float>>> rows;
    std::vector<int> used;
    std::vector<int64_t> first;
    std::vector<float> ys;
    ExpertBuffers buffers;
  };
  MoeScratch moe_;
  MoeCounts moe_counts_;
  double attention_s_ = 0;  // attention()'s wall time so far
  cpu::SiluMulFn activation_kernel(GateActivation act) const;
  struct ExpertBias {  // an expert's rows of ExpertWeights' biases (null: none)
    const float *gate = nullptr, *up = nullptr, *down = nullptr;
  };
  // One expert's products over m rows `in` into out [m, down.rows] (b.gate holds the
  // activation); with gate_of_output, also its product into b.scale [m].
  void expert_products(ExpertBuffers& b, const float* in, int64_t m, const Weight& gate, const Weight& up,
                       const Weight& down, GateActivation act, const Weight* gate_of_output, const ExpertBias& bias,
                       float* out);
  std::vector<size_t> gather_counts_;
};

}  // namespace tandem
