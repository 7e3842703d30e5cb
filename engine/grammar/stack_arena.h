// The machinery under the matcher and the token masker: the grammar flattened into numbered
// positions, and stacks of positions stored as shared, hash-consed nodes.
//
// A stack is the parser's return path: its top is the byte-set element that must match the next
// byte, the nodes below it are the positions to resume at once the rule above them ends. The
// state of a recognizer is a set of such stacks (one per way the bytes so far can be parsed).
// Reading a byte advances every stack whose top matches it and "settles" the result: a finished
// sequence pops to its caller, a rule reference expands into one stack per alternative, until
// every top is a byte set again (or the stack is empty: the sentence may end there).
//
// Nodes are interned by (position, parent), so two equal stacks are the same node id and a set of
// stacks is a sorted vector of ids: deduplication and equality are integer comparisons, and a
// stack shares its tail with every stack that grew from it. A rule reference that ends its
// sequence pushes no return position (a tail call), so right recursion (`chars ::= char chars`)
// keeps the stack flat and a state inside a string recurs exactly.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/error.h"
#include "engine/grammar/budget.h"
#include "engine/grammar/grammar.h"

namespace tandem::grammar {

// The grammar with every sequence laid end to end, each followed by an End slot; a position is
// an index into `slots`.
struct FlatGrammar {
  enum class Kind : uint8_t { Bytes, Rule, End };
  struct Slot {
    Kind kind = Kind::End;
    int32_t rule = -1;                // Rule: the referenced rule
    std::array<uint64_t, 4> bytes{};  // Bytes: bit b set <=> byte b matches
    bool matches(uint8_t b) const { return (bytes[b >> 6] >> (b & 63)) & 1; }
  };
  std::shared_ptr<const Grammar> source;
  std::vector<Slot> slots;
  std::vector<std::vector<int32_t>> alternatives;  // per rule: the position each alternative starts at
  int32_t root = 0;

  // Errors on a rule reference or root out of range, or a rule without alternatives (the rest of
  // validate()'s checks surface as errors when the matcher meets them).
  static Result<std::shared_ptr<const FlatGrammar>> build(std::shared_ptr<const Grammar> g);
};

class StackArena {
 public:
  static constexpr int32_t kEmpty = 0;  // the empty stack: the sentence is complete
  // The bottom of a truncated stack (the token masker's shared walks, lazy_dfa.h): frames
  // below it are unknown, so a pop into it "escapes": that parse is dropped and escaped() says so.
  static constexpr int32_t kBottom = 1;

  explicit StackArena(const FlatGrammar& g, const StateLimits& limits = {});
  const StateLimits& limits() const { return limits_; }
  // Whether the last start() or step() popped into kBottom.
  bool escaped() const { return escaped_; }
  // Which bound the last start() or step() that returned false passed.
  Overflow overflow() const { return overflow_; }
  // Settle steps the last start() or step() took (what a token mask's budget charges).
  size_t last_work() const { return work_; }

  // The node for `pos` on top of `parent` (both already interned).
  int32_t intern(int32_t pos, int32_t parent);
  int32_t pos(int32_t node) const { return nodes_[node].pos; }
  int32_t parent(int32_t node) const { return nodes_[node].parent; }

  // The settled stacks of the grammar's start. False when a bound of the limits is passed
  // (overflow() says which).
  bool start(std::vector<int32_t>& out);
  // The settled stacks after reading byte `b` from the stacks `tops` (sorted, unique), sorted and
  // unique in `out` (empty: no stack can read `b`). False when a bound is passed (`out` is then
  // unspecified).
  bool step(std::span<const int32_t> tops, uint8_t b, std::vector<int32_t>& out);

  // Matcher states as flat int vectors: for each stack, its length then its positions bottom to
  // top (a truncated stack starts with kBottomMark); stacks in lexicographic order, so equal sets
  // of stacks give equal vectors.
  static constexpr int32_t kBottomMark = -1;
  std::vector<int32_t> flatten(std::span<const int32_t> tops) const;
  void unflatten(std::span<const int32_t> flat, std::vector<int32_t>& tops);

 private:
  struct Node {
    int32_t pos;
    int32_t parent;
    int32_t depth;  // frames from the bottom (kEmpty and kBottom: 0)
  };
  // Adds to `out` every settled stack that continuing at `pos` above `parent` leads to.
  bool settle(int32_t pos, int32_t parent, std::vector<int32_t>& out, int depth);
  // The node for (pos, parent), or -1 past max_depth.
  int32_t push(int32_t pos, int32_t parent);
  // Sorts and dedups `out`; false past max_stacks or max_state_ints.
  bool finish(std::vector<int32_t>& out);
  void grow_index();

  const FlatGrammar& g_;
  std::vector<Node> nodes_;  // [0] is the empty stack
  // Open addressing from (pos, parent) to node id; capacity a power of two, at most half full.
  std::vector<uint64_t> index_keys_;
  std::vector<int32_t> index_ids_;
  StateLimits limits_;
  size_t work_ = 0;  // settle steps for the current byte
  bool escaped_ = false;
  Overflow overflow_ = Overflow::None;
};

}  // namespace tandem::grammar
