// The byte codec of disaggregated serving's messages (engine/handoff_message.h): fixed-size
// fields copied as they are, arrays and strings as a 64-bit count then their elements. The
// ranks of one job run the same build on the same kind of machine, so there is no byte
// swapping; what a reader checks is that every field lies inside the buffer. A field that does
// not fit (a count past the bytes left, a buffer cut short) stops the reader with an error
// naming the field, and nothing after it is read.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/core.h>

namespace tandem {

struct HandoffWriter {
  std::vector<uint8_t> out;
  template <class T>
  void pod(const char*, const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof v);
  }
  template <class T>
  void array(const char* name, const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    pod(name, (uint64_t)v.size());
    if (v.empty()) return;
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    out.insert(out.end(), p, p + v.size() * sizeof(T));
  }
  void text(const char* name, const std::string& s) {
    pod(name, (uint64_t)s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
};

// Every read is checked against the bytes left; the first field that does not fit sets
// `error` and every later read does nothing.
struct HandoffReader {
  std::span<const uint8_t> in;
  std::string error;  // empty while every field fitted
  bool ok() const { return error.empty(); }
  // A bool travels as one byte: any value but 0 or 1 is refused (copying it into a bool would
  // be undefined behaviour).
  void pod(const char* name, bool& v) {
    uint8_t b = 0;
    pod(name, b);
    if (ok() && b > 1) return fail(fmt::format("field '{}' is {}, not a bool", name, b));
    v = b == 1;
  }
  template <class T>
  void pod(const char* name, T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (!ok()) return;
    if (in.size() < sizeof v)
      return fail(fmt::format("field '{}' is cut short ({} bytes, {} left)", name, sizeof v, in.size()));
    std::memcpy(&v, in.data(), sizeof v);
    in = in.subspan(sizeof v);
  }
  template <class T>
  void array(const char* name, std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    uint64_t n = 0;
    pod(name, n);
    if (!ok()) return;
    if (n > in.size() / sizeof(T))
      return fail(fmt::format("field '{}' claims {} entries of {} bytes, but {} bytes are left", name, n, sizeof(T), in.size()));
    v.resize((size_t)n);
    if (n > 0) std::memcpy(v.data(), in.data(), (size_t)n * sizeof(T));
    in = in.subspan((size_t)n * sizeof(T));
  }
  void text(const char* name, std::string& s) {
    uint64_t n = 0;
    pod(name, n);
    if (!ok()) return;
    if (n > in.size()) return fail(fmt::format("field '{}' claims {} bytes, but {} are left", name, n, in.size()));
    s.assign(reinterpret_cast<const char*>(in.data()), (size_t)n);
    in = in.subspan((size_t)n);
  }
  void fail(std::string why) {
    if (ok()) error = std::move(why);
  }
};

}  // namespace tandem
