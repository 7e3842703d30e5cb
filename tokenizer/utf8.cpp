#include "tokenizer/utf8.h"

#include <algorithm>

namespace tandem {

int utf8_seq_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}

static bool valid_seq(std::string_view s, size_t i, int len) {
  if (len == 1) return (unsigned char)s[i] < 0x80;
  if (i + len > s.size()) return false;
  for (int k = 1; k < len; k++)
    if (((unsigned char)s[i + k] & 0xC0) != 0x80) return false;
  return true;
}

std::vector<std::string_view> utf8_chars(std::string_view text) {
  std::vector<std::string_view> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    int len = utf8_seq_len((unsigned char)text[i]);
    if (!valid_seq(text, i, len)) len = 1;
    out.push_back(text.substr(i, len));
    i += len;
  }
  return out;
}

std::vector<std::string_view> utf8_chars_by_lead(std::string_view text) {
  static constexpr int kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};  // by the high nibble
  std::vector<std::string_view> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t len = std::min<size_t>(kLen[(unsigned char)text[i] >> 4], text.size() - i);
    out.push_back(text.substr(i, len));
    i += len;
  }
  return out;
}

bool utf8_valid(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const int len = utf8_seq_len((unsigned char)text[i]);
    if (!valid_seq(text, i, len)) return false;
    const uint32_t cp = utf8_decode(text, i);
    const int shortest = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (len != shortest || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return false;
  }
  return true;
}

std::string utf8_replace_invalid(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 16);
  for (size_t i = 0; i < text.size();) {
    const int len = utf8_seq_len((unsigned char)text[i]);
    if (!valid_seq(text, i, len)) {
      out += "\xEF\xBF\xBD";
      i += 1;
      continue;
    }
    // Well-formed in shape: keep its code point, re-encoded shortest (an overlong "$" is "$",
    // as llama.cpp reads it). Surrogates and code points past U+10FFFF have no encoding.
    const uint32_t cp = utf8_decode(text, i);
    out += (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF ? "\xEF\xBF\xBD" : utf8_encode(cp);
  }
  return out;
}

std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += (char)cp;
  } else if (cp < 0x800) {
    s += (char)(0xC0 | (cp >> 6));
    s += (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += (char)(0xE0 | (cp >> 12));
    s += (char)(0x80 | ((cp >> 6) & 0x3F));
    s += (char)(0x80 | (cp & 0x3F));
  } else {
    s += (char)(0xF0 | (cp >> 18));
    s += (char)(0x80 | ((cp >> 12) & 0x3F));
    s += (char)(0x80 | ((cp >> 6) & 0x3F));
    s += (char)(0x80 | (cp & 0x3F));
  }
  return s;
}

uint32_t utf8_decode(std::string_view s, size_t& i) {
  const unsigned char c = (unsigned char)s[i];
  const int len = utf8_seq_len(c);
  if (len == 1 || !valid_seq(s, i, len)) {
    i += 1;
    return c;
  }
  uint32_t cp = len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; k++) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
  i += len;
  return cp;
}

std::string Utf8Streamer::push(std::string_view bytes) {
  pending_.append(bytes);
  // Find where the last (possibly incomplete) sequence starts: at most 3 bytes back.
  size_t cut = pending_.size();
  for (size_t back = 1; back <= 3 && back <= pending_.size(); back++) {
    const unsigned char c = (unsigned char)pending_[pending_.size() - back];
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const int len = utf8_seq_len(c);
    if (len > (int)back) cut = pending_.size() - back;  // lead byte whose sequence is unfinished
    break;
  }
  std::string ready = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return ready;
}

std::string Utf8Streamer::flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace tandem
