#include "core/units.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace tandem {

namespace {

std::string three_digits(double v, const char* unit) {
  if (v >= 100) return fmt::format("{:.0f} {}", v, unit);
  if (v >= 10) return fmt::format("{:.1f} {}", v, unit);
  return fmt::format("{:.2f} {}", v, unit);
}

}  // namespace

std::string format_bytes(double b) {
  if (b < 1000) return fmt::format("{:.0f} bytes", b);
  static const char* units[] = {"kB", "MB", "GB", "TB", "PB"};
  int u = -1;
  while (b >= 999.5 && u < 4) b /= 1000, u++;
  return three_digits(b, units[u]);
}

std::string format_bytes_binary(double b) {
  if (b < 1024) return fmt::format("{:.0f} bytes", b);
  static const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = -1;
  while (b >= 1023.5 && u < 4) b /= 1024, u++;
  return three_digits(b, units[u]);
}

Result<uint64_t> parse_bytes(std::string_view text) {
  std::string s;
  for (char c : text)
    if (!std::isspace((unsigned char)c)) s += c;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(v) || v < 0) return make_error("'{}' is not a size (try 24GiB, 1.5GB, 4096)", text);
  std::string unit(end);
  for (char& c : unit) c = (char)std::tolower((unsigned char)c);
  if (!unit.empty() && unit.back() == 'b') unit.pop_back();
  double scale = 0;
  if (unit.empty()) scale = 1;
  else if (unit == "k") scale = 1e3;
  else if (unit == "m") scale = 1e6;
  else if (unit == "g") scale = 1e9;
  else if (unit == "t") scale = 1e12;
  else if (unit == "ki") scale = 1024.0;
  else if (unit == "mi") scale = 1024.0 * 1024;
  else if (unit == "gi") scale = 1024.0 * 1024 * 1024;
  else if (unit == "ti") scale = 1024.0 * 1024 * 1024 * 1024;
  else return make_error("'{}': unknown size unit (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)", text);
  const double bytes = v * scale;
  if (bytes > 1.8e19) return make_error("'{}' is too large", text);
  return (uint64_t)std::llround(bytes);
}

}  // namespace tandem
