// Byte counts for people: "1.34 GB" (decimal, three significant digits, as the seed notes
// write sizes) and parsing of sizes such as "24GiB", "1.5GB", "800MiB" or "4096".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"

namespace tandem {

// Three significant digits in decimal units: 1342177280 -> "1.34 GB", 10737418240 -> "10.7 GB".
std::string format_bytes(double bytes);
// Binary units: 25769803776 -> "24.0 GiB".
std::string format_bytes_binary(double bytes);
// "24GiB", "24 GiB", "1.5GB", "800M" (M, G, T decimal; Mi, Gi, Ti binary; B optional), "4096".
Result<uint64_t> parse_bytes(std::string_view text);

}  // namespace tandem
