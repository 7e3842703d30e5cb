// What one template render may spend. A GGUF's chat template is untrusted code: every step,
// every allocation, the nesting of syntax and values, and the wall time are bounded, and each
// limit's error names it. The defaults are far above what real chat templates use (thousands of
// steps, kilobytes of values, nesting under 20) and far below what hurts a server.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace tandem::jinja {

struct Limits {
  // Statements, expression evaluations and loop iterations (empty ones too), added up.
  int64_t max_steps = 10'000'000;
  // Any one string or list a step creates, checked before it is allocated (a list counts
  // sizeof(Value) bytes per item).
  size_t max_value_bytes = size_t{16} << 20;
  // The rendered prompt.
  size_t max_output_bytes = size_t{16} << 20;
  // Every string and list a render creates or copies into a list, dict or loop, added up
  // (bounds the memory held at once, too).
  size_t max_total_bytes = size_t{512} << 20;
  // Wall time of one render, checked as steps are counted: a render ends on its own by then.
  std::chrono::milliseconds max_time{2000};
  // Template syntax (brackets, operators, statements), request JSON and values (printed,
  // compared, tojson'd) nested deeper than this are an error, never a stack overflow.
  int max_nesting = 128;
  // Macro calls inside macro calls (recursion).
  int max_call_depth = 64;
  // Optional: when it becomes true (e.g. the server is shutting down) the render stops at its
  // next check with an error.
  const std::atomic<bool>* cancel = nullptr;
};

}  // namespace tandem::jinja
