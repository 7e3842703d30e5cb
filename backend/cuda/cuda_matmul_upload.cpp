// Weights onto the device: validation, the quantized types' split of every block into quant
// bytes and scale bytes (cuda_matmul_layout.cuh), and allocation errors that name the bytes.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_matmul_internal.cuh"
#include "core/units.h"

namespace tandem::cuda {

bool matmul_supported(DType type) { return block_split(type).block_bytes != 0; }

Result<DeviceBuffer> device_alloc(size_t bytes, std::string_view what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e == cudaSuccess) return DeviceBuffer(p);
  cudaGetLastError();  // an allocation failure is not sticky: clear it for the next call
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  return make_error("CUDA: cannot allocate {} bytes ({}) for {}: {} (device has {} free of {})", bytes,
                    format_bytes(bytes), what, cudaGetErrorString(e), format_bytes(free_bytes),
                    format_bytes(total_bytes));
}

Status validate_weight(const WeightSource& src) {
  const BlockSplit s = block_split(src.type);
  if (s.block_bytes == 0 || !src.compute_supported)
    return make_error("weight {}: type {} has no CUDA matmul kernel (supported: F32, F16, BF16, Q8_0, Q4_0, "
                      "Q4_1, Q4_K, Q6_K)",
                      src.name, dtype_name(src.type));
  if (src.rows <= 0 || src.cols <= 0)
    return make_error("weight {}: empty shape {} x {}", src.name, src.rows, src.cols);
  if (src.cols % s.block_elems != 0)
    return make_error("weight {}: {} columns is not a whole number of {}-element {} blocks", src.name, src.cols,
                      s.block_elems, dtype_name(src.type));
  const size_t expect = (size_t)(src.cols / s.block_elems) * (size_t)s.block_bytes;
  if (src.row_bytes != expect)
    return make_error("weight {}: rows of {} bytes, but {} {} columns take {}", src.name, src.row_bytes, src.cols,
                      dtype_name(src.type), expect);
  if (src.data == nullptr) return make_error("weight {}: no data", src.name);
  return Status::Ok();
}

void repack_quantized(const WeightSource& src, uint8_t* dst) {
  const BlockSplit s = block_split(src.type);
  const int64_t blocks = src.cols / s.block_elems;
  const WeightView v = weight_view(src.type, src.rows, src.cols, dst);
  uint8_t* quants = dst;
  uint8_t* meta = dst + (v.meta - v.quants);
  // The alignment gap between the two regions is zeroed so the upload is deterministic.
  std::memset(quants + src.rows * v.q_row_bytes, 0, (size_t)(v.meta - v.quants - src.rows * v.q_row_bytes));
  for (int64_t r = 0; r < src.rows; r++) {
    const uint8_t* row = src.data + (size_t)r * src.row_bytes;
    uint8_t* q = quants + r * v.q_row_bytes;
    uint8_t* m = meta + r * v.m_row_bytes;
    for (int64_t b = 0; b < blocks; b++, row += s.block_bytes, q += s.q_len, m += s.m_len) {
      std::memcpy(q, row + s.q_off, (size_t)s.q_len);
      // The scale bytes: the block's bytes before the quants, then those after them.
      std::memcpy(m, row, (size_t)s.q_off);
      std::memcpy(m + s.q_off, row + s.q_off + s.q_len, (size_t)(s.block_bytes - s.q_off - s.q_len));
    }
  }
}

Result<DeviceWeight> upload_weight(const WeightSource& src, cudaStream_t stream) {
  TANDEM_TRY(validate_weight(src));
  const int64_t bytes = packed_bytes(src.type, src.rows, src.cols);
  auto mem = device_alloc((size_t)bytes, fmt::format("weight {} ({} x {} {})", src.name, src.rows, src.cols,
                                                     dtype_name(src.type)));
  if (!mem) return mem.error();
  std::vector<uint8_t> repacked;
  const void* host = src.data;
  if (is_quantized(src.type)) {
    repacked.resize((size_t)bytes);
    repack_quantized(src, repacked.data());
    host = repacked.data();
  }
  // Plain types are copied as they are: only the tensor's own bytes (the device rows' padding
  // to 16 bytes is never read as data; reading that far past the file's tensor could fault).
  const size_t copy = is_quantized(src.type) ? (size_t)bytes : (size_t)src.rows * src.row_bytes;
  TANDEM_TRY(check(cudaMemcpyAsync(mem->get(), host, copy, cudaMemcpyHostToDevice, stream),
                   "copying a weight to the device"));
  // The host bytes (the repack, or the caller's mapping) must outlive the copy.
  TANDEM_TRY(check(cudaStreamSynchronize(stream), "copying a weight to the device"));
  static std::atomic<uint64_t> uploads{0};
  DeviceWeight w;
  w.id = ++uploads;
  w.type = src.type;
  w.rows = src.rows;
  w.cols = src.cols;
  w.row_bytes = src.row_bytes;
  w.data = mem->get();
  w.owner = std::shared_ptr<void>(mem->release(), DeviceFree{});
  return w;
}

}  // namespace tandem::cuda
