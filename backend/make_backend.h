// Choosing the backend a model runs on, by name: "cpu", "cuda", or "auto" (the GPU when one
// is present and tandem was built with CUDA, else the CPU). Plus what a report says about the
// GPU: its name and memory, and its measured roofs (HBM read bandwidth, tensor-core rate),
// which `tandem bench` and `explain` set a GPU phase's figures against.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace tandem {

class GgufFile;

struct BackendChoice {
  std::string device = "auto";  // "cpu" | "cuda" | "auto"
  // The CPU's options (device "cpu", or "auto" without a GPU).
  int threads = 0;                     // 0: every core (OMP_NUM_THREADS when set)
  std::string isa = "auto";            // "scalar" | "avx2" | "avx512" | "auto"
  bool quantized_activations = true;   // 8-bit activations for the quant types' products (quant_dot.h)
  std::vector<std::string> exact_products;  // weights whose products keep f32 activations (CPU)
  // The GPU's options.
  int cuda_device = 0;
  bool cuda_graphs = true;  // decode passes captured as CUDA graphs
};

// BackendChoice::exact_products for an --exact-products option: a comma-separated list of
// tensor name parts ("output,ffn_down"), "none", or "auto": the output head (output,
// token_embd) on models under 500M parameters whose head is at most a third of them, else none.
std::vector<std::string> exact_products_for(const std::string& option, const GgufFile& f);

// The backend the choice names. Errors: an unknown device or ISA; "cuda" in a build without
// CUDA, or on a machine whose driver sees no GPU (the message says which).
Result<std::shared_ptr<Backend>> make_backend(const BackendChoice& choice);

// True when this build has the CUDA backend (TANDEM_CUDA).
bool cuda_built();

struct GpuInfo {
  std::string name;          // "NVIDIA H200"
  int compute_major = 0, compute_minor = 0;
  int sm_count = 0;
  uint64_t memory_free = 0;   // bytes, now
  uint64_t memory_total = 0;  // bytes
  double peak_hbm_gb_s = 0;   // from the memory clock and bus width (0 when the driver does not say)
};
// The GPU's description, or why there is none (not built with CUDA, no driver, no device).
Result<GpuInfo> probe_gpu(int device = 0);

struct GpuRoofs {
  double read_gb_s = 0;       // a streaming read of a buffer well past L2, GB/s
  double tensor_tflops = 0;   // cuBLAS F16 GEMM (F32 accumulate), 8192^3, TFLOP/s
  double bf16_tflops = 0;     // the same in BF16
};
// Measures the roofs (about a second of GPU time). Errors as probe_gpu.
Result<GpuRoofs> measure_gpu_roofs(int device = 0);

}  // namespace tandem
