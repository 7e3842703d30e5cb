// Byte-exact GGUF block layouts of the quantized types tandem computes with.
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem::cpu {

constexpr int kQK = 32;    // elements per block of the legacy quant types
constexpr int kQK_K = 256;  // elements per super-block of the K-quants

#pragma pack(push, 1)
struct BlockQ4_0 {  // x = d * (q - 8), q in 0..15
  uint16_t d;        // fp16 scale
  uint8_t qs[kQK / 2];  // element j in low nibble of qs[j], element j+16 in the high nibble
};
struct BlockQ4_1 {  // x = d * q + m
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {  // x = d * (q - 16), q in 0..31
  uint16_t d;
  uint8_t qh[4];  // bit j of the little-endian u32: the fifth bit of element j
  uint8_t qs[kQK / 2];  // low 4 bits as in Q4_0: element j low nibble, element j+16 high nibble
};
struct BlockQ5_1 {  // x = d * q + m, q in 0..31
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {  // x = d * q
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ4_K {  // 8 sub-blocks of 32 with 6-bit scales and mins
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {  // Q4_K's scales plus a fifth bit: x = d * sc * q - dmin * m, q in 0..31
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];  // bit s of qh[l]: the fifth bit of element l of sub-block s
  uint8_t qs[kQK_K / 2];  // as Q4_K: sub-blocks 2k and 2k+1 are the low and high nibbles of qs[32k..]
};
struct BlockQ6_K {  // 16 sub-blocks of 16 with 8-bit scales; 6-bit quants split in ql (4) + qh (2)
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
struct BlockMxfp4 {  // x = kMxfp4Values[q] * 2^(e - 128): E2M1 codes, doubled, under an E8M0 scale
  uint8_t e;            // E8M0 exponent
  uint8_t qs[kQK / 2];  // 4-bit codes as in Q4_0: element j low nibble, element j+16 high nibble
};
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockMxfp4) == 17);

// MXFP4's 16 E2M1 codes as twice their value (bit 3 the sign): integers, so 8-bit products
// take them as int8 weights. The SIMD kernels look them up with a byte shuffle.
alignas(16) static constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Half the E8M0 scale e (2^(e - 127)), since kMxfp4Values are doubled: 2^(e - 128), exact for
// every byte (e 0 and 1 are subnormal, 255 is 2^127, none is NaN), as ggml's
// ggml_e8m0_to_fp32_half.
static inline float mxfp4_scale(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// static: each TU (scalar or SIMD-targeted) keeps its own copy, so the linker never mixes them.
// Unpacks the 6-bit scale and min of sub-block j (0..7) of a Q4_K or Q5_K block.
static inline void q4_k_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace tandem::cpu
