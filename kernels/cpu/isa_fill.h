// The dispatch glue the ISA twins share: which type, token count and head size goes to which
// instance of a file's inner loops. The loops are declared here once and defined by each ISA
// file for its own level (each file gets its own copy of this header's anonymous namespace,
// compiled with its flags); the switches live here once, the tuned loops stay in the files.
#pragma once

#include "kernels/cpu/kernel_table.h"

namespace tandem::cpu {
namespace {

// A run-time token count (1..8; more counts as 8) to the instance K::run<T, NT>: each count its
// own instance, its accumulators in registers. X: the activations' element (BlockQ8Act, float).
template <class K, DType T, typename X>
void by_token_count(const uint8_t* group, int64_t cols, const X* x, int64_t x_stride, int n_tokens, float* out,
                    int64_t out_stride, int valid_rows) {
  switch (n_tokens) {
    case 1: return K::template run<T, 1>(group, cols, x, x_stride, out, out_stride, valid_rows);
    case 2: return K::template run<T, 2>(group, cols, x, x_stride, out, out_stride, valid_rows);
    case 3: return K::template run<T, 3>(group, cols, x, x_stride, out, out_stride, valid_rows);
    case 4: return K::template run<T, 4>(group, cols, x, x_stride, out, out_stride, valid_rows);
    case 5: return K::template run<T, 5>(group, cols, x, x_stride, out, out_stride, valid_rows);
    case 6: return K::template run<T, 6>(group, cols, x, x_stride, out, out_stride, valid_rows);
    case 7: return K::template run<T, 7>(group, cols, x, x_stride, out, out_stride, valid_rows);
    default: return K::template run<T, 8>(group, cols, x, x_stride, out, out_stride, valid_rows);
  }
}

// The packed 8-bit kernels (packed_quant.h) of NT tokens: packed_quant_avx2.cpp and
// packed_quant_avx512.cpp define gemm (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4), gemm_kquant (Q4_K, Q5_K)
// and gemm_q6_k.
struct PackedQuantLoops {
  template <DType T, int NT>
  static void gemm(const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride, float* out,
                   int64_t out_stride, int valid_rows);
  template <DType T, int NT>
  static void gemm_kquant(const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride, float* out,
                          int64_t out_stride, int valid_rows);
  template <int NT>
  static void gemm_q6_k(const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride, float* out,
                        int64_t out_stride, int valid_rows);

  // The kernel of type T for NT tokens.
  template <DType T, int NT>
  static void run(const uint8_t* group, int64_t cols, const BlockQ8Act* x, int64_t x_stride, float* out,
                  int64_t out_stride, int valid_rows) {
    if constexpr (T == DType::Q6_K) gemm_q6_k<NT>(group, cols, x, x_stride, out, out_stride, valid_rows);
    else if constexpr (packed_kquant(T)) gemm_kquant<T, NT>(group, cols, x, x_stride, out, out_stride, valid_rows);
    else gemm<T, NT>(group, cols, x, x_stride, out, out_stride, valid_rows);
  }
};

template <DType... Ts>
void fill_packed_types(CpuKernels& k) {
  (k.act8.packed.set(Ts, by_token_count<PackedQuantLoops, Ts, BlockQ8Act>), ...);
}

inline void fill_packed_quant(CpuKernels& k) {
  fill_packed_types<DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K,
                    DType::Q6_K, DType::MXFP4>(k);
}

// The packed float kernel (packed_float.h) of type T (F16, BF16) for NT tokens, for a level
// whose kernel takes up to 8 tokens a pass (packed_float_avx512.cpp).
struct PackedFloatLoops {
  template <DType T, int NT>
  static void run(const uint8_t* group, int64_t cols, const float* x, int64_t x_stride, float* out,
                  int64_t out_stride, int valid_rows);
};

// Attention's head kernels (kernel_table.h: AttendHeadsFn) for heads of NV vectors:
// attention_avx2.cpp and attention_avx512.cpp define run, each at its vector width (Lanes
// floats). The table holds one entry per head size.
struct AttentionLoops {
  template <DType T, int NV>
  static void run(int n_heads, const float* q, const uint8_t* const* k_rows, const uint8_t* const* v_rows,
                  int64_t n_keys, float scale, float* scores, int64_t scores_stride, float* out, float* stats);
};

template <int Lanes, DType T, int HeadDim>
void attend_heads_at(int, int n_heads, const float* q, const uint8_t* const* k_rows, const uint8_t* const* v_rows,
                     int64_t n_keys, float scale, float* scores, int64_t scores_stride, float* out, float* stats) {
  AttentionLoops::run<T, HeadDim / Lanes>(n_heads, q, k_rows, v_rows, n_keys, scale, scores, scores_stride, out,
                                          stats);
}

template <int Lanes, DType T, int... HeadDims>
void fill_attend_type(CpuKernels& k) {
  (k.attend_heads.set(T, HeadDims, attend_heads_at<Lanes, T, HeadDims>), ...);
}

template <int Lanes>
void fill_attend_heads(CpuKernels& k) {
  fill_attend_type<Lanes, DType::F32, 64, 96, 128, 256>(k);
  fill_attend_type<Lanes, DType::F16, 64, 96, 128, 256>(k);
  fill_attend_type<Lanes, DType::Q8_0, 64, 96, 128, 256>(k);
}

}  // namespace
}  // namespace tandem::cpu
