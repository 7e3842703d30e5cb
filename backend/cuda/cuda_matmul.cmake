# The CUDA backend's matrix products (backend/cuda/cuda_matmul*.cu, contract: cuda_matmul.h) as
# a library of their own: host code in .cpp (g++), kernels in .cu (nvcc; no fmt format strings
# there, as nvcc cannot evaluate fmt's consteval checks), and their micro-benchmark. Included by the top-level CMakeLists.txt
# when TANDEM_CUDA is on (CUDA enabled, CUDAToolkit found).
add_library(tandem_cuda_matmul STATIC
  backend/cuda/cublas_api.cpp
  backend/cuda/cuda_matmul.cpp
  backend/cuda/cuda_matmul_upload.cpp
  backend/cuda/cuda_matmul_workspace.cpp
  backend/cuda/cuda_matmul_activations.cu
  backend/cuda/cuda_matmul_matvec.cu
  backend/cuda/cuda_matmul_gemm.cpp
  backend/cuda/cuda_matmul_gemm.cu
  backend/cuda/cuda_matmul_embed.cu
)
# cuBLAS is opened at run time (cublas_api.h), not linked: linking maps 150 MB into every process.
target_link_libraries(tandem_cuda_matmul PUBLIC tandem_lib CUDA::cudart ${CMAKE_DL_LIBS})
target_compile_options(tandem_cuda_matmul PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)

# GB/s of decode's matrix-vector products and TFLOP/s of the prefill GEMM, per weight type.
add_executable(tandem_cuda_matmul_bench bench/cuda_matmul_bench.cpp)
target_link_libraries(tandem_cuda_matmul_bench PRIVATE tandem_cuda_matmul)
set_target_properties(tandem_cuda_matmul_bench PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
