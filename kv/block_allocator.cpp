#include "kv/block_allocator.h"

#include <algorithm>
#include <cstring>

namespace tandem {

BlockAllocator::BlockAllocator(int64_t n_blocks, int block_tokens, PrefixHashFn hash)
    : block_tokens_(block_tokens), hash_(std::move(hash)) {
  if (!hash_) key_ = random_sip_key();
  const size_t n = (size_t)std::max<int64_t>(n_blocks, 0);
  refs_.assign(n, 0);
  prefix_id_.assign(n, 0);
  parent_id_.assign(n, 0);
  hash_of_.assign(n, 0);
  tokens_.assign(n * (size_t)block_tokens, 0);
  indexed_.assign(n, false);
  lru_at_.resize(n);
  in_lru_.assign(n, false);
  for (size_t b = n; b-- > 0;) free_.push_back((int32_t)b);
}

int32_t BlockAllocator::allocate() {
  int32_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {  // evict the least recently used cached prefix
    b = lru_.front();
    lru_.pop_front();
    in_lru_[(size_t)b] = false;
    forget(b);
  } else {
    return -1;
  }
  refs_[(size_t)b] = 1;
  return b;
}

void BlockAllocator::retain(int32_t b) {
  if (refs_[(size_t)b]++ == 0 && in_lru_[(size_t)b]) {  // a cached block comes back into use
    lru_.erase(lru_at_[(size_t)b]);
    in_lru_[(size_t)b] = false;
  }
}

void BlockAllocator::release(int32_t b) {
  if (refs_[(size_t)b] <= 0) return;
  if (--refs_[(size_t)b] > 0) return;
  make_free(b);
}

void BlockAllocator::make_free(int32_t b) {
  if (indexed_[(size_t)b]) {
    lru_at_[(size_t)b] = lru_.insert(lru_.end(), b);
    in_lru_[(size_t)b] = true;
  } else {
    forget(b);  // an unindexed prefix can never be found again
    free_.push_back(b);
  }
}

void BlockAllocator::forget(int32_t b) {
  if (indexed_[(size_t)b]) by_hash_.erase(hash_of_[(size_t)b]);
  indexed_[(size_t)b] = false;
  prefix_id_[(size_t)b] = parent_id_[(size_t)b] = hash_of_[(size_t)b] = 0;
}

uint64_t BlockAllocator::scope_root(std::string_view name) const {
  if (name.empty()) return 0;
  return siphash24(key_, name.data(), name.size()) | (1ull << 63);
}

uint64_t BlockAllocator::chain_hash(uint64_t parent, std::span<const int32_t> tokens) const {
  uint64_t h;
  if (hash_) {
    h = hash_(parent, tokens);
  } else {
    // [parent hash, token ids]: at most a block's worth of bytes, hashed in one call.
    std::vector<uint8_t> msg(8 + tokens.size() * 4);
    std::memcpy(msg.data(), &parent, 8);
    if (!tokens.empty()) std::memcpy(msg.data() + 8, tokens.data(), tokens.size() * 4);
    h = siphash24(key_, msg.data(), msg.size());
  }
  return h == 0 ? 1 : h;  // 0 means "no hash" to callers
}

bool BlockAllocator::holds(int32_t b, uint64_t parent_id, std::span<const int32_t> tokens) const {
  if (prefix_id_[(size_t)b] == 0 || parent_id_[(size_t)b] != parent_id || tokens.size() != (size_t)block_tokens_) return false;
  return std::equal(tokens.begin(), tokens.end(), tokens_.begin() + (ptrdiff_t)b * block_tokens_);
}

void BlockAllocator::publish(int32_t b, int32_t parent_block, uint64_t hash, std::span<const int32_t> tokens, uint64_t root) {
  const uint64_t parent_id = parent_block < 0 ? root : prefix_id_[(size_t)parent_block];
  if (parent_block >= 0 && parent_id == 0) return;  // the parent's prefix is unverified: cannot vouch
  publish_under(b, parent_id, hash, tokens);
}

namespace {

// The parent id a block of layer group `group` is verified under: bit 62 and the group above
// the anchor's prefix id (prefix ids count up from 1 and stay far below 2^56; scope roots have
// bit 63 set), so no group-0 parent id ever equals it.
uint64_t beside_id(int group, uint64_t anchor) {
  return anchor == 0 || anchor >= (1ull << 56) ? 0 : (1ull << 62) | ((uint64_t)(group & 63) << 56) | anchor;
}

}  // namespace

void BlockAllocator::publish_beside(int32_t b, int group, uint64_t anchor, uint64_t hash, std::span<const int32_t> tokens) {
  if (const uint64_t id = beside_id(group, anchor)) publish_under(b, id, hash, tokens);
}

void BlockAllocator::publish_under(int32_t b, uint64_t parent_id, uint64_t hash, std::span<const int32_t> tokens) {
  if (hash == 0 || prefix_id_[(size_t)b] != 0 || tokens.size() != (size_t)block_tokens_) return;
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + (ptrdiff_t)b * block_tokens_);
  parent_id_[(size_t)b] = parent_id;
  hash_of_[(size_t)b] = hash;
  auto it = by_hash_.find(hash);
  if (it != by_hash_.end() && holds(it->second, parent_id, tokens)) {
    // The same prefix is already indexed (two sequences prefilled it at once): share its id,
    // so either copy is a valid parent for the blocks that follow.
    prefix_id_[(size_t)b] = prefix_id_[(size_t)it->second];
    return;
  }
  if (it != by_hash_.end()) {
    // A collision, or an entry whose parent prefix is gone: the newer, verified prefix takes
    // the index slot; an unreferenced loser leaves the cache.
    // (A loser still in use keeps its prefix id, so its holder can go on publishing after it.)
    const int32_t old = it->second;
    by_hash_.erase(it);
    indexed_[(size_t)old] = false;
    if (in_lru_[(size_t)old]) {
      lru_.erase(lru_at_[(size_t)old]);
      in_lru_[(size_t)old] = false;
      make_free(old);
    }
  }
  prefix_id_[(size_t)b] = next_prefix_id_++;
  indexed_[(size_t)b] = true;
  by_hash_[hash] = b;
}

int32_t BlockAllocator::lookup(int32_t parent_block, uint64_t hash, std::span<const int32_t> tokens, uint64_t root) {
  const uint64_t parent_id = parent_block < 0 ? root : prefix_id_[(size_t)parent_block];
  if (parent_block >= 0 && parent_id == 0) return -1;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return -1;
  if (!holds(it->second, parent_id, tokens)) {
    rejected_hits_++;
    return -1;
  }
  retain(it->second);
  return it->second;
}

int32_t BlockAllocator::find(uint64_t parent_id, uint64_t hash, std::span<const int32_t> tokens) const {
  if (parent_id == 0) return -1;
  auto it = by_hash_.find(hash);
  return it != by_hash_.end() && holds(it->second, parent_id, tokens) ? it->second : -1;
}

bool BlockAllocator::cached_beside(int group, uint64_t anchor, uint64_t hash, std::span<const int32_t> tokens) const {
  return find(beside_id(group, anchor), hash, tokens) >= 0;
}

int32_t BlockAllocator::lookup_beside(int group, uint64_t anchor, uint64_t hash, std::span<const int32_t> tokens) {
  const int32_t b = find(beside_id(group, anchor), hash, tokens);
  if (b >= 0) retain(b);
  return b;
}

}  // namespace tandem
