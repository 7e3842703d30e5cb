// The CUDA backend: the forward pass's ops on one GPU and one stream, with the weights, the
// activations and the paged KV store in device memory.
//
// A pass runs one of two ways (run_pass):
// - direct: each op launches its kernels as the body calls it (prefill, long passes);
// - graph: decode-sized passes (few tokens) first run the body only to record what every op
//   would launch (its signature: pointers, shapes, constants). A pass whose signature matches
//   one seen before replays that pass's captured CUDA graph; a new one is captured, then
//   replayed. Passes whose products go through cuBLAS (more than a few tokens) run directly:
//   no cuBLAS call is captured. A pass shape whose capture fails runs directly from then on;
//   other shapes keep their graphs. Everything that changes from one decode step to the next (token ids, positions,
//   slots, block tables, logit rows) is copied to fixed device buffers before the replay, and
//   the kernels read lengths from there: a replay stays valid as the context grows.
//
// Ops cannot return errors (backend.h); a failed CUDA or cuBLAS call is kept as this backend's
// sticky error (error(), which Model::forward checks), reported once on stderr, and later ops
// are skipped. Nothing here aborts the process.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_batch.h"
#include "backend/cuda/cuda_matmul.h"

namespace tandem {

struct CudaBackendOptions {
  int device = 0;
  bool graphs = true;              // capture and replay decode passes
  int64_t graph_max_tokens = 64;   // passes of at most this many tokens run as graphs
  int graph_cache = 16;            // distinct pass shapes kept captured
};

class CudaBackend final : public Backend {
 public:
  // Error when the device cannot be opened (no GPU, no driver, bad index, a device left broken
  // by an earlier fault in this process).
  static Result<std::shared_ptr<CudaBackend>> create(const CudaBackendOptions& o = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string describe() const override;
  Tensor new_tensor(int64_t rows, int64_t cols) override;
  Tensor upload(std::span<const float> host, int64_t rows, int64_t cols) override;
  std::span<const float> read(const Tensor& t) override;
  Result<KvStore> new_kv_store(DType dtype, int n_layer, int block_tokens, int64_t n_blocks, size_t row_bytes) override;
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

  // The first CUDA failure since creation (Ok when none): ops cannot return one themselves.
  Status error() const override { return error_; }
  // Waits for every launched kernel; returns error().
  Status synchronize();

  // What the last run_pass did: kernels it launched (products count one each; a graph replay
  // counts the kernels inside the graph), and whether it replayed or captured a graph.
  struct PassStats {
    int64_t kernels = 0;
    bool graph = false;     // ran as a CUDA graph
    bool captured = false;  // the graph was captured in this pass (first of its shape)
  };
  PassStats last_pass() const { return last_pass_; }
  int64_t graphs_captured() const { return graphs_captured_; }

  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }

 private:
  explicit CudaBackend(const CudaBackendOptions& o);
  Status init();

  enum class Mode { Direct, Record, Capture };
  // Records the op's signature (and its batch's shape) in Record mode and returns true:
  // launch nothing. Returns false in the other modes.
  bool record(std::initializer_list<uint64_t> sig, const BatchOffsets* batch = nullptr);
  // The batch's arrays on the device: staged once per pass (per op outside a pass) and, in
  // direct mode, copied at once; record mode copies them all after the body.
  DeviceBatch device_batch(const ForwardBatch& b);
  // Other per-step bytes (RoPE frequencies, logit rows): their offset in the device buffer.
  size_t stage(const void* data, size_t bytes);
  void begin_staging();
  void flush_staging();
  Status grow_staging(size_t bytes);
  Status check_kv(const KvStore& kv, int head_dim);
  void after_launch(const char* what, int kernels = 1);
  // A failed op: the capture's error while capturing (the pass then runs directly), else the
  // backend's sticky error.
  void note(Status s);
  void fail(Status s);
  bool failed() const { return !error_.ok(); }
  Status reserve_workspace(int64_t n_tokens);
  void clear_graphs();
  void run_graph(const std::function<void()>& body);
  void run_direct(const std::function<void()>& body);
  float* attention_scratch(size_t floats);

  CudaBackendOptions opts_;
  int device_ = 0;
  int sm_count_ = 0, cc_major_ = 0, cc_minor_ = 0;
  uint64_t total_memory_ = 0;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  Status error_ = Status::Ok();
  Status capture_error_ = Status::Ok();
  Mode mode_ = Mode::Direct;
  bool in_pass_ = false;

  // Per-step arrays: packed on the host, copied through a pinned buffer to one device buffer.
  BatchStager stager_;
  std::vector<std::pair<const ForwardBatch*, BatchOffsets>> staged_batches_;  // in this pass
  uint8_t* staging_host_ = nullptr;  // pinned [staging_cap_]
  uint8_t* staging_dev_ = nullptr;   // device [staging_cap_]
  size_t staging_cap_ = 0;
  size_t uploaded_ = 0;              // bytes of the image already copied
  cudaEvent_t staged_ = nullptr;     // the last copy out of the pinned buffer
  const void* checked_kv_ = nullptr; // a KV store found to be device memory

  std::unique_ptr<cuda::MatmulWorkspace> ws_;
  int64_t ws_tokens_ = 0, ws_cols_ = 0, ws_rows_ = 0;  // what the workspace was reserved for
  int64_t max_cols_ = 0, max_rows_ = 0;                // over the weights prepared for products

  float* attn_scratch_ = nullptr;  // split-K partial results
  size_t attn_scratch_floats_ = 0;

  std::vector<uint64_t> sig_;  // the pass being recorded
  bool sig_uses_cublas_ = false;  // the recorded pass has a product through cuBLAS: no capture
  // Signatures whose capture failed: they run directly (bounded; past kMaxUncapturable distinct
  // failures graphs are turned off, saying why).
  std::vector<std::vector<uint64_t>> uncapturable_;
  int64_t kernels_ = 0;        // launched in the pass so far
  struct Graph {
    std::vector<uint64_t> sig;
    cudaGraphExec_t exec = nullptr;
    int64_t kernels = 0;
    uint64_t last_used = 0;
  };
  std::vector<Graph> graphs_;
  uint64_t pass_counter_ = 0;
  int64_t graphs_captured_ = 0;
  PassStats last_pass_;

  // Host mirrors that read() returns, per device address: pinned so the copy is one DMA.
  struct Mirror {
    std::weak_ptr<void> owner;
    float* host = nullptr;
    size_t floats = 0;
  };
  std::unordered_map<const void*, Mirror> mirrors_;
};

}  // namespace tandem
