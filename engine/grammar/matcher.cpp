#include "engine/grammar/matcher.h"

#include <utility>

namespace tandem::grammar {

uint64_t hash_state(std::span<const int32_t> state) {
  uint64_t h = 0x243F6A8885A308D3ull ^ state.size();
  for (int32_t v : state) {
    h ^= (uint32_t)v;
    h *= 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
  }
  return h;
}

Matcher::Matcher(std::shared_ptr<const FlatGrammar> flat, std::vector<int32_t> state, const StateLimits& limits)
    : flat_(std::move(flat)), state_(std::move(state)), hash_(hash_state(state_)), limits_(limits) {}

Result<Matcher> Matcher::create(std::shared_ptr<const Grammar> g, const StateLimits& limits) {
  auto flat = FlatGrammar::build(std::move(g));
  if (!flat) return flat.error();
  StackArena arena(**flat, limits);
  std::vector<int32_t> tops;
  if (!arena.start(tops))
    return make_error("grammar ({}): its start passes the grammar budget: {} (an ambiguous or left-recursive grammar)",
                      (*flat)->source->source, describe(arena.overflow(), limits));
  if (tops.empty()) return make_error("grammar ({}): matches no text at all", (*flat)->source->source);
  auto state = arena.flatten(tops);
  return Matcher(std::move(*flat), std::move(state), limits);
}

bool Matcher::advance(std::string_view bytes, std::vector<int32_t>& state, Overflow& overflow) const {
  StackArena arena(*flat_, limits_);
  std::vector<int32_t> cur, next;
  arena.unflatten(state_, cur);
  overflow = Overflow::None;
  for (char c : bytes) {
    if (!arena.step(cur, (uint8_t)c, next)) {
      overflow = arena.overflow();
      return false;
    }
    if (next.empty()) return false;
    std::swap(cur, next);
  }
  state = arena.flatten(cur);
  return true;
}

bool Matcher::accept(std::string_view bytes) {
  budget_error_.clear();
  if (bytes.empty()) return true;
  std::vector<int32_t> next;
  Overflow overflow;
  if (!advance(bytes, next, overflow)) {
    if (overflow != Overflow::None)
      budget_error_ = fmt::format("grammar budget: the text so far leaves {}", describe(overflow, limits_));
    return false;
  }
  state_ = std::move(next);
  hash_ = hash_state(state_);
  return true;
}

bool Matcher::can_accept(std::string_view bytes) const {
  if (bytes.empty()) return true;
  std::vector<int32_t> next;
  Overflow overflow;
  return advance(bytes, next, overflow);
}

// The flat state is sorted, so the empty stack (length 0) comes first when present.
bool Matcher::can_end() const { return !state_.empty() && state_[0] == 0; }

// Settled stacks never keep a top that matches no byte, so only the empty stack cannot read one.
bool Matcher::must_end() const { return state_.size() == 1 && state_[0] == 0; }

size_t Matcher::n_stacks() const {
  size_t n = 0;
  for (size_t i = 0; i < state_.size(); i += 1 + state_[i]) n++;
  return n;
}

}  // namespace tandem::grammar
