// The CPU kernels of one ISA level as one table of function pointers, filled once per level:
// the scalar twins first, then each ISA file the level runs, each over the last (AVX-512 is the
// AVX2 table with AVX-512's kernels on top). Callers hold the table and index it by weight or
// cache type; no call chooses a level again. Each ISA file keeps its tuned inner loops and
// only says which of them fill which slots (fill_*_avx2 / fill_*_avx512 below).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/packed_float.h"
#include "kernels/cpu/packed_quant.h"
#include "kernels/cpu/quant_dot.h"

namespace tandem::cpu {

// n_heads consecutive query heads (q: [n_heads, head_dim]) that share one KV head, whose key t
// has its K row at k_rows[t] and V row at v_rows[t] (head_dim elements of the cache type):
// out[h] = softmax(q[h] . K^T * scale) V for each head. scores: [n_heads, scores_stride]
// scratch, scores_stride >= n_keys. stats: nullptr, or [n_heads, 2] receiving each head's
// largest scaled score m and sum of exp(score - m), which merging the results of several key
// segments needs. A head's result does not depend on n_heads. An entry serves the head_dim
// it was filled for (attention.h: AVX2 and AVX-512, head_dim 64, 96, 128 or 256; F32, F16 or
// Q8_0 cache, where Q8_0 gives exactly what an F32 cache of its dequantized values gives).
using AttendHeadsFn = void (*)(int head_dim, int n_heads, const float* q, const uint8_t* const* k_rows,
                               const uint8_t* const* v_rows, int64_t n_keys, float scale, float* scores,
                               int64_t scores_stride, float* out, float* stats);

// One kind of kernel by weight (or cache) type: slot i holds GGUF type id i's, nullptr where
// the level has none. The ISA files call set() while filling: always inlined, so no file runs
// a copy that another file compiled for another level.
template <typename Fn>
class ByType {
 public:
  Fn operator()(DType t) const {
    const auto i = static_cast<uint32_t>(t);
    return i < kSlots ? fn_[i] : nullptr;
  }
  [[gnu::always_inline]] void set(DType t, Fn f) { fn_[static_cast<uint32_t>(t)] = f; }

 private:
  static constexpr uint32_t kSlots = static_cast<uint32_t>(DType::MXFP4) + 1;  // the largest id with kernels
  Fn fn_[kSlots] = {};
};

// Attention kernels by cache type and head size (64, 96, 128, 256).
class AttendHeadsByShape {
 public:
  AttendHeadsFn operator()(DType kv_type, int head_dim) const {
    const int d = dim_slot(head_dim);
    return d < 0 ? nullptr : by_dim_[d](kv_type);
  }
  [[gnu::always_inline]] void set(DType kv_type, int head_dim, AttendHeadsFn f) {
    by_dim_[dim_slot(head_dim)].set(kv_type, f);
  }

 private:
  [[gnu::always_inline]] static int dim_slot(int head_dim) {
    return head_dim == 64 ? 0 : head_dim == 96 ? 1 : head_dim == 128 ? 2 : head_dim == 256 ? 3 : -1;
  }
  ByType<AttendHeadsFn> by_dim_[4];
};

struct CpuKernels {
  Isa isa = Isa::Scalar;
  // false: every product in float (exact, for reference checks); true: the weight types of
  // quant_dot.h (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4) multiply
  // 8-bit-quantized activations, as llama.cpp does (faster).
  bool quantized_activations = true;

  F32DotFn dot_f32 = nullptr;
  F32TileFn tile_f32 = nullptr;
  F32ToF16Fn f32_to_f16 = nullptr;
  QuantizeQ8_0Fn quantize_q8_0 = nullptr;
  QuantizeActFn quantize_act = nullptr;
  SiluMulFn silu_mul = nullptr;
  SiluMulFn gelu_tanh_mul = nullptr;
  // Float arithmetic, so used in either activation mode. A level's row dot and tokens kernel
  // come from the same file, so their sums agree.
  ByType<RowDotFn> row_dot;
  ByType<RowDotTokensFn> row_dot_tokens;
  ByType<AxpyFn> axpy;
  ByType<PackedFloatGemmFn> packed_float;
  AttendHeadsByShape attend_heads;
  // The same results for many heads at once (a block of prefill rows against one segment),
  // by outer products (attention_wide_avx512.cpp); empty where the level has none.
  AttendHeadsByShape attend_wide_heads;

  // Products with 8-bit activations: what the level has (the fills write here) ...
  struct Act8 {
    ByType<QuantDotFn> quant_dot;
    ByType<QuantDot4Fn> quant_dot4;
    ByType<PackedGemmFn> packed;
  } act8;
  // ... and what a caller gets: nothing in f32-activation mode.
  QuantDotFn quant_dot(DType t) const { return quantized_activations ? act8.quant_dot(t) : nullptr; }
  QuantDot4Fn quant_dot4(DType t) const { return quantized_activations ? act8.quant_dot4(t) : nullptr; }
  PackedGemmFn packed(DType t) const { return quantized_activations ? act8.packed(t) : nullptr; }
};

// The table of a level this CPU runs (supported_isas()), filled on first use and kept: a
// level's ISA files run nothing before their level is asked for.
const CpuKernels& kernels_for(Isa isa);
// The same table in the given activation mode.
CpuKernels kernels_for(Isa isa, bool quantized_activations);

// The KV cache stores' conversions at the best level this CPU has (every level writes the same
// bytes for non-NaN input; dot.h).
void f32_to_f16(const float* x, uint16_t* out, int64_t n);
void quantize_q8_0(const float* x, void* out, int64_t n);

// Each ISA file's share of its level's table (a file built without its flags fills nothing).
void fill_dot_avx2(CpuKernels& k);
void fill_quant_dot_avx2(CpuKernels& k);
void fill_packed_quant_avx2(CpuKernels& k);
void fill_packed_float_avx2(CpuKernels& k);
void fill_attention_avx2(CpuKernels& k);
void fill_ops_avx2(CpuKernels& k);
void fill_dot_avx512(CpuKernels& k);
void fill_packed_quant_avx512(CpuKernels& k);
void fill_packed_float_avx512(CpuKernels& k);
void fill_attention_avx512(CpuKernels& k);
void fill_attention_wide_avx512(CpuKernels& k);
void fill_ops_avx512(CpuKernels& k);

}  // namespace tandem::cpu
