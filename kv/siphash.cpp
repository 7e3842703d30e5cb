#include "kv/siphash.h"

#include <cstring>
#include <random>

namespace tandem {

namespace {

constexpr uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

struct SipState {
  uint64_t v0, v1, v2, v3;
  void round() {
    v0 += v1, v1 = rotl(v1, 13), v1 ^= v0, v0 = rotl(v0, 32);
    v2 += v3, v3 = rotl(v3, 16), v3 ^= v2;
    v0 += v3, v3 = rotl(v3, 21), v3 ^= v0;
    v2 += v1, v1 = rotl(v1, 17), v1 ^= v2, v2 = rotl(v2, 32);
  }
  void absorb(uint64_t m) {  // two compression rounds per 8-byte word
    v3 ^= m;
    round(), round();
    v0 ^= m;
  }
};

uint64_t load_le64(const uint8_t* p, size_t n) {  // n <= 8 bytes, little-endian
  uint64_t m = 0;
  for (size_t i = 0; i < n; i++) m |= (uint64_t)p[i] << (8 * i);
  return m;
}

}  // namespace

uint64_t siphash24(const SipKey& key, const void* data, size_t len) {
  SipState s{key[0] ^ 0x736f6d6570736575ull, key[1] ^ 0x646f72616e646f6dull, key[0] ^ 0x6c7967656e657261ull,
             key[1] ^ 0x7465646279746573ull};
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t whole = len / 8 * 8;
  for (size_t i = 0; i < whole; i += 8) s.absorb(load_le64(p + i, 8));
  // The last word holds the remaining bytes and the length's low byte in its top byte.
  s.absorb(load_le64(p + whole, len - whole) | ((uint64_t)(len & 0xFF) << 56));
  s.v2 ^= 0xFF;
  s.round(), s.round(), s.round(), s.round();  // four finalization rounds
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

SipKey random_sip_key() {
  std::random_device rd;
  SipKey k{};
  for (auto& w : k) w = ((uint64_t)rd() << 32) ^ rd();
  return k;
}

}  // namespace tandem
