// libFuzzer entry point for the server's request validation: any body must parse to a request
// or to an error naming the field, never crash.
//   build-fuzz/tests/fuzz_openai_request -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto j = nlohmann::ordered_json::parse(body, nullptr, false);
  if (j.is_discarded()) return 0;
  std::string bad;
  (void)tandem::server::parse_request(j, (data[0] & 1) != 0, 42, &bad);
  return 0;
}
