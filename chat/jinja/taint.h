// Taint: which bytes of a string came from request data. The interpreter carries these spans
// through every string operation (exactly for concatenation, slicing, strip, replace, join,
// format, case changes; conservatively, the whole result, where exactness is impossible), so
// the rendered prompt knows which of its bytes a user wrote. See tokenizer/rendered_prompt.h.
#pragma once

#include <algorithm>
#include <cstddef>

#include "tokenizer/rendered_prompt.h"

namespace tandem::jinja {

// Adds [b, e) after every span already in t, merging with the last one when they touch.
inline void taint_add(ByteSpans& t, size_t b, size_t e) {
  if (b >= e) return;
  if (!t.empty() && t.back().second >= b) {
    t.back().second = std::max(t.back().second, e);
    return;
  }
  t.emplace_back(b, e);
}

// Appends src's spans shifted by offset (offset at or past dst's last span).
inline void taint_append(ByteSpans& dst, const ByteSpans& src, size_t offset) {
  for (const auto& [b, e] : src) taint_add(dst, b + offset, e + offset);
}

// The spans inside [b, e), relative to b.
inline ByteSpans taint_slice(const ByteSpans& t, size_t b, size_t e) {
  ByteSpans out;
  for (const auto& [sb, se] : t) {
    if (se <= b) continue;
    if (sb >= e) break;
    taint_add(out, std::max(sb, b) - b, std::min(se, e) - b);
  }
  return out;
}

// True when some byte of [b, e) is tainted.
inline bool taint_overlaps(const ByteSpans& t, size_t b, size_t e) {
  auto it = std::upper_bound(t.begin(), t.end(), b, [](size_t pos, const std::pair<size_t, size_t>& s) { return pos < s.second; });
  return it != t.end() && it->first < e;
}

inline ByteSpans taint_whole(size_t n) { return n ? ByteSpans{{0, n}} : ByteSpans{}; }

}  // namespace tandem::jinja
