// Disaggregated serving's control messages (engine/handoff_message.h) as bytes: every kind
// comes back as it was sent, and a buffer that is cut short, longer than its fields, of an
// unknown kind or holding impossible values is refused with an error saying what is wrong,
// never read past its end (the sanitizer build checks the last part). No MPI, no model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "engine/handoff_message.h"
#include "engine/scheduler.h"

namespace tandem {
namespace {

using Kind = HandoffMessage::Kind;

// A message of `kind` with every field set to something other than its default.
HandoffMessage full(Kind kind) {
  HandoffMessage m;
  m.kind = kind;
  m.id = 41, m.first_block = 2, m.n_blocks = 3;
  m.tokens = {1, 504, 3575, 28};
  m.cache_scope = "key:abc", m.tenant = "tenant \xe2\x9c\x93", m.error = "prefill rank 2: it broke";
  m.n_cached = 32, m.queue_s = 0.25, m.prefill_s = 1.5;
  m.logits = {-1.5f, 0.f, 3.25f, std::numeric_limits<float>::lowest()};
  m.block_bytes = 18432, m.used_blocks = 7, m.total_blocks = 256, m.queued_tokens = 900;
  m.blocks_sent = 11, m.bytes_sent = 11 * 18432, m.busy_s = 4.75;
  m.running = 5, m.handoffs = 12, m.peer = 3;
  m.request = {1, 2, 3, 250};
  // Two tokens, the first with two alternatives, the second with none; then the finish.
  m.ev_tokens = {17, 9}, m.ev_logprobs = {-0.5f, -2.f}, m.ev_top_n = {2, 0};
  m.ev_top_ids = {17, 4}, m.ev_top_logprobs = {-0.5f, -1.25f};
  m.finish = (uint8_t)FinishReason::Stop, m.finish_flags = 1;
  m.n_prompt = 40, m.n_generated = 2, m.n_preemptions = 1;
  m.transfer_s = 0.002, m.stream_s = 0.125;
  return m;
}

void expect_same(const HandoffMessage& a, const HandoffMessage& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.first_block, b.first_block);
  EXPECT_EQ(a.n_blocks, b.n_blocks);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.cache_scope, b.cache_scope);
  EXPECT_EQ(a.tenant, b.tenant);
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.n_cached, b.n_cached);
  EXPECT_EQ(a.queue_s, b.queue_s);
  EXPECT_EQ(a.prefill_s, b.prefill_s);
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.block_bytes, b.block_bytes);
  EXPECT_EQ(a.used_blocks, b.used_blocks);
  EXPECT_EQ(a.total_blocks, b.total_blocks);
  EXPECT_EQ(a.queued_tokens, b.queued_tokens);
  EXPECT_EQ(a.blocks_sent, b.blocks_sent);
  EXPECT_EQ(a.bytes_sent, b.bytes_sent);
  EXPECT_EQ(a.busy_s, b.busy_s);
  EXPECT_EQ(a.running, b.running);
  EXPECT_EQ(a.handoffs, b.handoffs);
  EXPECT_EQ(a.peer, b.peer);
  EXPECT_EQ(a.request, b.request);
  EXPECT_EQ(a.ev_tokens, b.ev_tokens);
  EXPECT_EQ(a.ev_logprobs, b.ev_logprobs);
  EXPECT_EQ(a.ev_top_n, b.ev_top_n);
  EXPECT_EQ(a.ev_top_ids, b.ev_top_ids);
  EXPECT_EQ(a.ev_top_logprobs, b.ev_top_logprobs);
  EXPECT_EQ(a.finish, b.finish);
  EXPECT_EQ(a.finish_flags, b.finish_flags);
  EXPECT_EQ(a.n_prompt, b.n_prompt);
  EXPECT_EQ(a.n_generated, b.n_generated);
  EXPECT_EQ(a.n_preemptions, b.n_preemptions);
  EXPECT_EQ(a.transfer_s, b.transfer_s);
  EXPECT_EQ(a.stream_s, b.stream_s);
}

const Kind kAllKinds[] = {Kind::Prefill, Kind::Cancel,   Kind::Heartbeat, Kind::Stop,     Kind::Hello,
                          Kind::Blocks,  Kind::Done,     Kind::Ended,     Kind::Stopped,  Kind::Decode,
                          Kind::Reserved, Kind::Events,  Kind::PeerDown,  Kind::Computed};

TEST(HandoffMessage, EveryKindIsListed) { EXPECT_EQ(std::size(kAllKinds), (size_t)HandoffMessage::kLastKind); }

TEST(HandoffMessage, EveryKindRoundTrips) {
  for (Kind k : kAllKinds) {
    SCOPED_TRACE((int)k);
    const HandoffMessage m = full(k);
    auto back = HandoffMessage::decode(m.encode());
    ASSERT_TRUE(back.ok()) << back.error().message;
    expect_same(back.value(), m);
  }
}

// What each sender writes: only its own fields set, the rest left at their defaults (empty
// arrays and strings included).
TEST(HandoffMessage, SparseMessagesRoundTrip) {
  HandoffMessage prefill;
  prefill.kind = Kind::Prefill, prefill.id = 7, prefill.tokens = {1, 2, 3};
  HandoffMessage cancel;
  cancel.kind = Kind::Cancel, cancel.id = 7;
  HandoffMessage heartbeat;  // the default kind, every field zero or empty
  HandoffMessage ended;
  ended.kind = Kind::Ended, ended.id = 9;  // cancelled: no error text
  HandoffMessage done;
  done.kind = Kind::Done, done.id = 9, done.logits.assign(49152, 0.5f);  // a whole vocabulary's row
  for (const HandoffMessage& m : {prefill, cancel, heartbeat, ended, done}) {
    SCOPED_TRACE((int)m.kind);
    auto back = HandoffMessage::decode(m.encode());
    ASSERT_TRUE(back.ok()) << back.error().message;
    expect_same(back.value(), m);
  }
}

std::string decode_error(const std::vector<uint8_t>& bytes) {
  auto m = HandoffMessage::decode(bytes);
  return m.ok() ? "" : m.error().message;
}

// Every prefix of every kind's encoding is refused (the copy leaves no byte past the end for
// a reader to find), with the field that did not fit named.
TEST(HandoffMessage, EveryTruncationIsRefused) {
  for (Kind k : kAllKinds) {
    const std::vector<uint8_t> bytes = full(k).encode();
    for (size_t n = 0; n < bytes.size(); n++) {
      const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + (ptrdiff_t)n);
      const std::string e = decode_error(cut);
      ASSERT_NE(e, "") << "kind " << (int)k << ", " << n << " of " << bytes.size() << " bytes";
      EXPECT_NE(e.find("hand-off message of " + std::to_string(n) + " bytes"), std::string::npos) << e;
    }
  }
  EXPECT_NE(decode_error({}).find("field 'magic' is cut short"), std::string::npos) << decode_error({});
}

TEST(HandoffMessage, TrailingBytesAreRefused) {
  std::vector<uint8_t> bytes = full(Kind::Blocks).encode();
  bytes.push_back(0);
  EXPECT_NE(decode_error(bytes).find("1 bytes left over after its last field"), std::string::npos) << decode_error(bytes);
}

TEST(HandoffMessage, WrongMagicAndUnknownKindsAreRefused) {
  std::vector<uint8_t> bytes = full(Kind::Done).encode();
  std::vector<uint8_t> other = bytes;
  other[0] ^= 0xff;
  EXPECT_NE(decode_error(other).find("not one"), std::string::npos) << decode_error(other);
  for (uint8_t kind : {0, (int)HandoffMessage::kLastKind + 1, 255}) {
    other = bytes;
    other[4] = kind;
    EXPECT_NE(decode_error(other).find("unknown kind " + std::to_string(kind)), std::string::npos) << decode_error(other);
  }
}

// Byte offset of the `tokens` count: magic (4), kind (1), id, first_block, n_blocks (8 each).
constexpr size_t kTokensCountAt = 4 + 1 + 3 * 8;

void put_u64(std::vector<uint8_t>& b, size_t at, uint64_t v) { std::memcpy(b.data() + at, &v, sizeof v); }

TEST(HandoffMessage, CountsPastTheBufferAreRefusedWithoutReading) {
  const std::vector<uint8_t> bytes = full(Kind::Prefill).encode();
  for (uint64_t n : {uint64_t{5}, uint64_t{1} << 40, ~uint64_t{0}, ~uint64_t{0} / 4 + 1}) {
    std::vector<uint8_t> bad = bytes;
    put_u64(bad, kTokensCountAt, n);
    const std::string e = decode_error(bad);
    SCOPED_TRACE(n);
    // 5 tokens fit in what follows (the strings and numbers after them): it reads them and
    // then fails further on, never past the end.
    EXPECT_NE(e, "");
    if (n > 5) {
      EXPECT_NE(e.find("field 'tokens' claims " + std::to_string(n) + " entries"), std::string::npos) << e;
    }
  }
  // A string's count past the end.
  std::vector<uint8_t> bad = bytes;
  const size_t scope_at = kTokensCountAt + 8 + 4 * sizeof(int32_t);
  put_u64(bad, scope_at, 1u << 20);
  EXPECT_NE(decode_error(bad).find("field 'cache_scope' claims 1048576 bytes"), std::string::npos) << decode_error(bad);
}

TEST(HandoffMessage, ImpossibleValuesAreRefused) {
  auto refused = [](HandoffMessage m, const std::string& why) {
    const std::string e = decode_error(m.encode());
    EXPECT_NE(e.find(why), std::string::npos) << "got: " << e;
  };
  HandoffMessage m = full(Kind::Blocks);
  m.first_block = -1;
  refused(m, "field 'first_block' is negative (-1)");
  m = full(Kind::Blocks), m.n_blocks = 0;
  refused(m, "announcing no block");
  m = full(Kind::Blocks), m.n_blocks = -5;
  refused(m, "field 'n_blocks' is negative");
  m = full(Kind::Heartbeat), m.used_blocks = -1;
  refused(m, "field 'used_blocks' is negative");
  m = full(Kind::Done), m.logits.clear();
  refused(m, "without the prompt's last logits row");
  m = full(Kind::Done), m.prefill_s = std::nan("");
  refused(m, "field 'prefill_s' is not a time");
  m = full(Kind::Prefill), m.tokens.clear();
  refused(m, "without a prompt");
  m = full(Kind::Hello), m.block_bytes = 0;
  refused(m, "blocks of 0 bytes");
  m = full(Kind::Decode), m.request.clear();
  refused(m, "without its request");
  m = full(Kind::PeerDown), m.peer = -1;
  refused(m, "field 'peer' is negative");
}

// An Events message's arrays must agree, or reading its alternatives would run past them.
TEST(HandoffMessage, InconsistentEventsAreRefused) {
  auto refused = [](HandoffMessage m, const std::string& why) {
    const std::string e = decode_error(m.encode());
    EXPECT_NE(e.find(why), std::string::npos) << "got: " << e;
  };
  HandoffMessage m = full(Kind::Events);
  m.ev_logprobs.pop_back();
  refused(m, "of 2 tokens with 1 logprobs and 2 counts");
  m = full(Kind::Events), m.ev_top_n = {3, 0};
  refused(m, "counting 3 alternatives but holding 2 ids and 2 logprobs");
  m = full(Kind::Events), m.ev_top_n = {-1, 3};
  refused(m, "with -1 alternatives");
  m = full(Kind::Events), m.ev_top_ids.pop_back();
  refused(m, "holding 1 ids");
  m = full(Kind::Events), m.finish = 9;
  refused(m, "finish reason 9");
  m = HandoffMessage{}, m.kind = Kind::Events;
  refused(m, "no token and no finish");
  // Anything else in another kind's arrays is no one's business.
  m = full(Kind::Heartbeat), m.ev_top_n = {3, 0};
  EXPECT_EQ(decode_error(m.encode()), "");
}

// Bytes that were never a message: whatever they hold, decode answers (an error) without
// reading outside them.
TEST(HandoffMessage, GarbageIsRefused) {
  uint64_t x = 88172645463325252ull;
  for (int round = 0; round < 2000; round++) {
    std::vector<uint8_t> b((size_t)(round % 300));
    for (uint8_t& v : b) x ^= x << 13, x ^= x >> 7, x ^= x << 17, v = (uint8_t)x;
    if (b.size() >= 5) std::memcpy(b.data(), &HandoffMessage::kMagic, 4), b[4] = (uint8_t)(1 + round % (int)HandoffMessage::kLastKind);
    EXPECT_FALSE(HandoffMessage::decode(b).ok()) << round;
  }
}

}  // namespace
}  // namespace tandem
