// The Responses API's memory of earlier answers, for previous_response_id: a bounded,
// in-memory store (its size `serve --responses-store`), least recently used first out. Each
// entry belongs to the tenant (API key) that made it: another key's lookup finds nothing, as
// for an id never stored, so ids say nothing across tenants. Thread-safe.
#pragma once

#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "server/openai_json.h"

namespace tandem::server {

struct StoredResponse {
  std::string tenant;
  // The conversation through this response, as chat messages (its input, then its answer):
  // what a request naming it as previous_response_id continues. Instructions are not in it
  // (OpenAI's previous_response_id does not carry them over).
  ojson messages;
  ojson response;  // the response object, for GET /v1/responses/{id}
};

class ResponsesStore {
 public:
  explicit ResponsesStore(size_t max_bytes) : max_bytes_(max_bytes) {}
  // Keeps `r` under `id`, evicting the least recently used entries past the budget. An entry
  // larger than the whole budget is not kept (false).
  bool put(const std::string& id, StoredResponse r);
  // The entry, if it is here and `tenant`'s.
  std::optional<StoredResponse> get(const std::string& id, const std::string& tenant);
  // Removes it if it is here and `tenant`'s.
  bool erase(const std::string& id, const std::string& tenant);
  size_t bytes() const;
  size_t size() const;
  size_t max_bytes() const { return max_bytes_; }

 private:
  struct Entry {
    StoredResponse r;
    size_t bytes;
    std::list<std::string>::iterator lru_pos;
  };
  void evict_one();

  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;  // under mu_
  std::list<std::string> lru_;                      // most recent first
  size_t bytes_ = 0;
};

}  // namespace tandem::server
