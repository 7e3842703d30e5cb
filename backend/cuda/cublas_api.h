// cuBLAS's few entry points tandem uses, opened with dlopen on first use. Linking libcublas
// maps its 150 MB cuBLASLt into every tandem process at start, GPU or not (`tandem --help`
// went from 5 MB to 221 MB resident); opened here, only a process that runs a product on the
// GPU pays for it.
#pragma once

#include <cublas_v2.h>

#include "core/error.h"

namespace tandem::cuda {

struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  // The C entry point (cuBLAS's header adds a C++ overload taking a cudaDataType compute type).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
};

// The API, loaded once (thread-safe); an error names the library it could not open or the
// symbol it lacks.
Result<const CublasApi*> cublas_api();

}  // namespace tandem::cuda
