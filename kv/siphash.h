// SipHash-2-4 (Aumasson and Bernstein, 2012): a keyed 64-bit hash. Without the key an attacker
// cannot compute hashes offline, so cannot search for two prompts whose prefix blocks collide
// (an unkeyed hash such as FNV-1a falls to a brute-force search in seconds).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace tandem {

using SipKey = std::array<uint64_t, 2>;  // k0, k1: the 16 key bytes read little-endian

uint64_t siphash24(const SipKey& key, const void* data, size_t len);

// A key from the operating system's random source (std::random_device).
SipKey random_sip_key();

}  // namespace tandem
