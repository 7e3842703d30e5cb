// matmul(): chooses decode's matrix-vector kernels or prefill's GEMM by the token count, and
// prepares the input in the form the chosen path reads (once per group: cuda_matmul_prepared.cuh);
// embed().
#include "backend/cuda/cuda_matmul_internal.cuh"
#include "backend/cuda/cuda_matmul_prepared.cuh"

namespace tandem::cuda {

namespace {

// Launches what turns ws.in into `form` unless the buffers already hold it.
void ensure_form(MatmulWorkspace::Impl& ws, unsigned form, cudaStream_t stream) {
  if (ws.forms & form) return;
  if (form == kFormQ8) {
    launch_quantize_q8_1(ws.in, ws.in_n, ws.in_cols, static_cast<int8_t*>(ws.act_q.get()),
                         static_cast<float2*>(ws.act_ds.get()), stream);
    ws.forms |= kFormQ8;
  } else {
    launch_convert_activations(ws.in, ws.in_n * ws.in_cols, ws.act_16.get(), form == kFormBF16, stream);
    ws.forms = (ws.forms & ~(kFormF16 | kFormBF16)) | form;  // one 16-bit buffer holds either
  }
}

}  // namespace

void prepare_input(const float* in, int64_t n, int64_t cols, MatmulWorkspace& ws) {
  MatmulWorkspace::Impl& w = *ws.impl();
  w.in = in;
  w.in_n = n;
  w.in_cols = cols;
  w.forms = 0;
}

bool matmul_uses_cublas(int64_t n) { return n > kMatvecMaxTokens; }

Status matmul_prepared(const DeviceWeight& w, const float* in, int64_t n, float* out, const float* bias,
                       MatmulWorkspace& ws, cudaStream_t stream) {
  MatmulWorkspace::Impl& impl = *ws.impl();
  if (n <= 0) return Status::Ok();
  if (!matmul_supported(w.type)) return make_error("CUDA matmul: no kernel for weight type {}", dtype_name(w.type));
  if (n > ws.max_tokens() || w.cols > impl.max_cols)
    return make_error("CUDA matmul: a product of {} tokens x {} columns past the reserved workspace ({} tokens x {} "
                      "columns): reserve() first",
                      n, w.cols, ws.max_tokens(), impl.max_cols);
  if (impl.in != in || impl.in_n != n || impl.in_cols != w.cols) prepare_input(in, n, w.cols, ws);
  const WeightView view = weight_view(w.type, w.rows, w.cols, w.data);
  if (n <= kMatvecMaxTokens) {
    if (is_quantized(w.type)) {
      ensure_form(impl, kFormQ8, stream);
      launch_matvec(view, static_cast<const int8_t*>(impl.act_q.get()), static_cast<const float2*>(impl.act_ds.get()),
                    nullptr, n, out, bias, stream);
    } else {
      launch_matvec(view, nullptr, nullptr, in, n, out, bias, stream);  // the type was checked above
    }
    return Status::Ok();
  }
  const void* x16 = nullptr;
  if (w.type != DType::F32) {
    ensure_form(impl, w.type == DType::BF16 ? kFormBF16 : kFormF16, stream);
    x16 = impl.act_16.get();
  }
  return run_gemm(view, in, x16, n, out, bias, impl, stream);
}

Status matmul(const DeviceWeight& w, const float* in, int64_t n, float* out, const float* bias, MatmulWorkspace& ws,
              cudaStream_t stream) {
  prepare_input(in, n, w.cols, ws);
  return matmul_prepared(w, in, n, out, bias, ws, stream);
}

Status embed(const DeviceWeight& w, const int32_t* tokens, int64_t n, float* out, float scale, cudaStream_t stream) {
  if (n <= 0) return Status::Ok();
  if (!matmul_supported(w.type)) return make_error("CUDA embed: no kernel for weight type {}", dtype_name(w.type));
  launch_embed(weight_view(w.type, w.rows, w.cols, w.data), tokens, n, out, scale, stream);
  return Status::Ok();
}

}  // namespace tandem::cuda
