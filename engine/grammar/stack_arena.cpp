#include "engine/grammar/stack_arena.h"

#include <algorithm>

namespace tandem::grammar {

namespace {

uint64_t index_key(int32_t pos, int32_t parent) { return ((uint64_t)(uint32_t)pos << 32) | (uint32_t)parent; }

size_t index_slot(uint64_t key, size_t mask) {
  key *= 0x9E3779B97F4A7C15ull;
  return (size_t)(key >> 29) & mask;
}

}  // namespace

Result<std::shared_ptr<const FlatGrammar>> FlatGrammar::build(std::shared_ptr<const Grammar> g) {
  if (!g) return make_error("grammar: none given");
  const auto n_rules = (int32_t)g->rules.size();
  if (g->root < 0 || g->root >= n_rules)
    return make_error("grammar ({}): root rule {} out of range ({} rules)", g->source, g->root, n_rules);
  auto flat = std::make_shared<FlatGrammar>();
  flat->root = g->root;
  flat->alternatives.resize(n_rules);
  for (int32_t r = 0; r < n_rules; r++) {
    const Rule& rule = g->rules[r];
    if (rule.alternatives.empty()) return make_error("grammar ({}): rule '{}' has no alternative", g->source, rule.name);
    for (const Sequence& seq : rule.alternatives) {
      flat->alternatives[r].push_back((int32_t)flat->slots.size());
      for (const Element& e : seq) {
        Slot s;
        if (e.kind == Element::Kind::Rule) {
          if (e.rule < 0 || e.rule >= n_rules)
            return make_error("grammar ({}): rule '{}' refers to rule {} out of range", g->source, rule.name, e.rule);
          s.kind = Kind::Rule;
          s.rule = e.rule;
        } else {
          s.kind = Kind::Bytes;
          s.bytes = e.bytes;
        }
        flat->slots.push_back(s);
      }
      flat->slots.push_back(Slot{});  // End
    }
  }
  flat->source = std::move(g);
  return std::shared_ptr<const FlatGrammar>(std::move(flat));
}

StackArena::StackArena(const FlatGrammar& g, const StateLimits& limits) : g_(g), limits_(limits) {
  nodes_.push_back(Node{-1, -1, 0});  // kEmpty
  nodes_.push_back(Node{-1, -1, 0});  // kBottom
  index_keys_.assign(256, ~0ull);
  index_ids_.assign(256, -1);
}

void StackArena::grow_index() {
  std::vector<uint64_t> keys(index_keys_.size() * 2, ~0ull);
  std::vector<int32_t> ids(keys.size(), -1);
  const size_t mask = keys.size() - 1;
  for (size_t i = 0; i < index_keys_.size(); i++) {
    if (index_ids_[i] < 0) continue;
    size_t s = index_slot(index_keys_[i], mask);
    while (ids[s] >= 0) s = (s + 1) & mask;
    keys[s] = index_keys_[i];
    ids[s] = index_ids_[i];
  }
  index_keys_ = std::move(keys);
  index_ids_ = std::move(ids);
}

int32_t StackArena::intern(int32_t pos, int32_t parent) {
  if (nodes_.size() * 2 >= index_keys_.size()) grow_index();
  const uint64_t key = index_key(pos, parent);
  const size_t mask = index_keys_.size() - 1;
  size_t s = index_slot(key, mask);
  while (index_ids_[s] >= 0) {
    if (index_keys_[s] == key) return index_ids_[s];
    s = (s + 1) & mask;
  }
  const auto id = (int32_t)nodes_.size();
  nodes_.push_back(Node{pos, parent, nodes_[parent].depth + 1});
  index_keys_[s] = key;
  index_ids_[s] = id;
  return id;
}

int32_t StackArena::push(int32_t pos, int32_t parent) {
  if ((size_t)nodes_[parent].depth >= limits_.max_depth) {
    overflow_ = Overflow::Depth;
    return -1;
  }
  return intern(pos, parent);
}

bool StackArena::settle(int32_t pos, int32_t parent, std::vector<int32_t>& out, int depth) {
  // Both bounds are far past what a sensible grammar needs; a depth past the first is left
  // recursion that validate() did not see (the matcher would otherwise recurse forever).
  if (depth > kMaxSettleDepth) {
    overflow_ = Overflow::SettleDepth;
    return false;
  }
  if (++work_ > limits_.max_settle_work) {
    overflow_ = Overflow::SettleWork;
    return false;
  }
  const FlatGrammar::Slot& slot = g_.slots[pos];
  switch (slot.kind) {
    case FlatGrammar::Kind::End:
      if (parent == kEmpty) {
        out.push_back(kEmpty);
        return true;
      }
      if (parent == kBottom) {
        escaped_ = true;
        return true;
      }
      return settle(nodes_[parent].pos, nodes_[parent].parent, out, depth + 1);
    case FlatGrammar::Kind::Bytes:
      // A top that matches no byte is a dead end, not a stack.
      if ((slot.bytes[0] | slot.bytes[1] | slot.bytes[2] | slot.bytes[3]) != 0) {
        const int32_t top = push(pos, parent);
        if (top < 0) return false;
        out.push_back(top);
      }
      return true;
    case FlatGrammar::Kind::Rule: {
      const int32_t ret = g_.slots[pos + 1].kind == FlatGrammar::Kind::End ? parent : push(pos + 1, parent);
      if (ret < 0) return false;
      for (int32_t alt : g_.alternatives[slot.rule])
        if (!settle(alt, ret, out, depth + 1)) return false;
      return true;
    }
  }
  return true;
}

bool StackArena::finish(std::vector<int32_t>& out) {
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  if (out.size() > limits_.max_stacks) {
    overflow_ = Overflow::Stacks;
    return false;
  }
  size_t ints = 0;  // flatten()'s size: a length and the frames of each stack
  for (int32_t top : out) ints += 1 + (size_t)nodes_[top].depth;
  if (ints > limits_.max_state_ints) {
    overflow_ = Overflow::StateSize;
    return false;
  }
  return true;
}

bool StackArena::start(std::vector<int32_t>& out) {
  out.clear();
  work_ = 0;
  escaped_ = false;
  overflow_ = Overflow::None;
  for (int32_t alt : g_.alternatives[g_.root])
    if (!settle(alt, kEmpty, out, 0)) return false;
  return finish(out);
}

bool StackArena::step(std::span<const int32_t> tops, uint8_t b, std::vector<int32_t>& out) {
  out.clear();
  work_ = 0;
  escaped_ = false;
  overflow_ = Overflow::None;
  for (int32_t top : tops) {
    if (top == kEmpty) continue;
    if (top == kBottom) {  // a parse that goes on in frames cut off: it might read anything
      escaped_ = true;
      continue;
    }
    const Node n = nodes_[top];
    if (!g_.slots[n.pos].matches(b)) continue;
    if (!settle(n.pos + 1, n.parent, out, 0)) return false;
  }
  return finish(out);
}

std::vector<int32_t> StackArena::flatten(std::span<const int32_t> tops) const {
  std::vector<std::vector<int32_t>> stacks;
  stacks.reserve(tops.size());
  for (int32_t top : tops) {
    std::vector<int32_t> s;
    int32_t n = top;
    for (; n != kEmpty && n != kBottom; n = nodes_[n].parent) s.push_back(nodes_[n].pos);
    if (n == kBottom) s.push_back(kBottomMark);
    std::reverse(s.begin(), s.end());
    stacks.push_back(std::move(s));
  }
  std::sort(stacks.begin(), stacks.end());
  std::vector<int32_t> flat;
  for (const auto& s : stacks) {
    flat.push_back((int32_t)s.size());
    flat.insert(flat.end(), s.begin(), s.end());
  }
  return flat;
}

void StackArena::unflatten(std::span<const int32_t> flat, std::vector<int32_t>& tops) {
  tops.clear();
  for (size_t i = 0; i < flat.size();) {
    const int32_t len = flat[i++];
    int32_t node = kEmpty;
    for (int32_t k = 0; k < len; k++, i++) node = flat[i] == kBottomMark ? kBottom : intern(flat[i], node);
    tops.push_back(node);
  }
  std::sort(tops.begin(), tops.end());
}

}  // namespace tandem::grammar
