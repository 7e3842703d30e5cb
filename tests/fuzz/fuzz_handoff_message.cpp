// libFuzzer entry point for disaggregated serving's control messages (engine/handoff_message.h):
// any bytes must decode to a message or an error, never a read outside them; a message that
// decodes must encode back to the same bytes.
//   build-fuzz/tests/fuzz_handoff_message -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <span>

#include "engine/handoff_message.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = tandem::HandoffMessage::decode(std::span<const uint8_t>(data, size));
  if (!m.ok()) return 0;
  const std::vector<uint8_t> again = m.value().encode();
  if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  return 0;
}
