#include "server/responses_store.h"

namespace tandem::server {

namespace {
// What an entry costs: its JSON as text, its id and tenant, and a fixed overhead for the maps.
size_t entry_bytes(const std::string& id, const StoredResponse& r) {
  return id.size() + r.tenant.size() + dump_json(r.messages).size() + dump_json(r.response).size() + 256;
}
}  // namespace

bool ResponsesStore::put(const std::string& id, StoredResponse r) {
  const size_t n = entry_bytes(id, r);
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) {
    bytes_ -= it->second.bytes;
    lru_.erase(it->second.lru_pos);
    entries_.erase(it);
  }
  if (n > max_bytes_) return false;
  while (bytes_ + n > max_bytes_ && !lru_.empty()) evict_one();
  lru_.push_front(id);
  entries_.emplace(id, Entry{std::move(r), n, lru_.begin()});
  bytes_ += n;
  return true;
}

void ResponsesStore::evict_one() {
  auto it = entries_.find(lru_.back());
  bytes_ -= it->second.bytes;
  entries_.erase(it);
  lru_.pop_back();
}

std::optional<StoredResponse> ResponsesStore::get(const std::string& id, const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.r.tenant != tenant) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second.lru_pos);  // used: the last to go
  return it->second.r;
}

bool ResponsesStore::erase(const std::string& id, const std::string& tenant) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.r.tenant != tenant) return false;
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru_pos);
  entries_.erase(it);
  return true;
}

size_t ResponsesStore::bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return bytes_;
}

size_t ResponsesStore::size() const {
  std::lock_guard<std::mutex> l(mu_);
  return entries_.size();
}

}  // namespace tandem::server
