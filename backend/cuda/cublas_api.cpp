#include "backend/cuda/cublas_api.h"

#include <dlfcn.h>

#include <string>

namespace tandem::cuda {

namespace {

Result<CublasApi> load() {
  void* lib = nullptr;
  std::string tried;
  for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib) break;
    tried += std::string(tried.empty() ? "" : ", ") + name;
  }
  if (!lib) return make_error("cuBLAS not found (tried {}): install the CUDA toolkit's libcublas", tried);
  CublasApi api;
  const char* missing = nullptr;
  auto bind = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    if (!fn && !missing) missing = symbol;
  };
  bind(api.create, "cublasCreate_v2");
  bind(api.destroy, "cublasDestroy_v2");
  bind(api.set_stream, "cublasSetStream_v2");
  bind(api.set_workspace, "cublasSetWorkspace_v2");
  bind(api.gemm_ex, "cublasGemmEx");
  bind(api.sgemm, "cublasSgemm_v2");
  if (missing) return make_error("cuBLAS lacks {}", missing);
  return api;  // the library stays open for the process's life
}

}  // namespace

Result<const CublasApi*> cublas_api() {
  static const Result<CublasApi> api = load();
  if (!api.ok()) return api.error();
  return &api.value();
}

}  // namespace tandem::cuda
