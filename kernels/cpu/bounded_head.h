#pragma once
// An exact output head's argmax at the speed of an 8-bit one.
//
// A head kept on f32 activations (--exact-products; small models' default, for accuracy) is a
// read of its weights in decode, but a serving step that samples many rows makes it f32
// multiply-add work: a third of a 16-stream step on 2 cores. A greedy row is read only for its
// largest logit, so for such rows:
//  1. every logit z8 on 8-bit activations (the packed int8 product of the same Q8_0 rows);
//  2. a bound on how far the f32 head's float z can be from it. With weight block b of row r
//     (A_rb = |d| x sum |q|, M_r = max_b A_rb) and token t's activations x against their 8-bit
//     version x8 in that block (h_tb = max |x - x8|, m_tb = max |x|):
//       |z - z8| <= sum_b A_rb (...) <= M_r G_t,  G_t = (1 + 1e-4) x sum_b (h_tb (1 + 1e-6) + 1e-5 m_tb)
//     (h is the activations' rounding; the 1e-5 m_tb covers both products' float rounding,
//     ~2e-6 of sum |w x| for 18-36 blocks; the factors the bound's own arithmetic);
//  3. the f32 head's own float again (WeightMatrix::dot, the same floats as its multi-token
//     kernel) for the row with the largest z8 and every row whose interval reaches the higher of
//     that float and the best lower end; every other row gets z8 - bound, below all of them.
// So the argmax, ties included, is the exact head's. Only Q8_0 heads whose multi-token float
// kernel equals the one-token dot (AVX2, AVX-512): there the recomputed floats are the head's.
#include <memory>
#include <vector>

#include "kernels/cpu/matmul.h"

namespace tandem::cpu {

struct BoundedHead {
  WeightMatrix int8;             // the same rows, packed for 8-bit activations
  std::vector<float> block_abs;  // [rows]: M_r, the largest |d| x sum |q| of the row's blocks

  // Null where the scheme does not apply (not Q8_0, no multi-token float kernel, no packed
  // int8 kernel at this ISA). Packs a second copy of the rows (the head's size again).
  static std::shared_ptr<const BoundedHead> make(const WeightMatrix& exact, const CpuKernels& q8);
};

// out[t * exact.rows + r] for the n_tokens rows of X ([n_tokens, cols]), with the argmax
// guarantee above. q8: the 8-bit kernel set (its quantizer is the packed product's).
void bounded_head_logits(const WeightMatrix& exact, const BoundedHead& head, const float* X, int64_t n_tokens,
                         float* out, const CpuKernels& q8);

}  // namespace tandem::cpu
