#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "gguf/gguf_file.h"
#include "gguf_builder.h"

namespace tandem {
namespace {

using test::GgufBuilder;

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

GgufBuilder sample() {
  GgufBuilder b;
  b.kv_str("general.architecture", "llama");
  b.kv_u32("llama.block_count", 2);
  b.kv_f32("llama.rope.freq_base", 10000.0f);
  b.kv_bool("tokenizer.ggml.add_bos_token", true);
  b.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "c"});
  b.kv_f32_array("tokenizer.ggml.scores", {0.5f, -1.0f, 2.0f});
  b.tensor("x", DType::F32, {4, 2}, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  b.tensor("y", DType::F32, {3}, f32_bytes({9, 10, 11}));
  return b;
}

TEST(Gguf, ParsesMetadataAndTensors) {
  const auto bytes = sample().build();
  auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
  ASSERT_TRUE(f.ok()) << f.error().message;
  const GgufFile& g = *f.value();
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(**g.get_string("general.architecture"), "llama");
  EXPECT_EQ(**g.get_uint("llama.block_count"), 2u);
  EXPECT_FLOAT_EQ((float)**g.get_float("llama.rope.freq_base"), 10000.0f);
  EXPECT_TRUE(**g.get_bool("tokenizer.ggml.add_bos_token"));
  const GgufArray* toks = g.get_array("tokenizer.ggml.tokens");
  ASSERT_NE(toks, nullptr);
  ASSERT_EQ(toks->count, 3u);
  EXPECT_EQ(toks->strings[2], "c");
  const GgufArray* scores = g.get_array("tokenizer.ggml.scores");
  ASSERT_NE(scores, nullptr);
  EXPECT_DOUBLE_EQ(scores->number(2), 2.0);
  const GgufTensor* x = g.find_tensor("x");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->n_elements(), 8u);
  EXPECT_EQ(x->n_rows(), 2u);
  float v[8];
  std::memcpy(v, x->data, 32);
  EXPECT_EQ(v[5], 6.0f);
  EXPECT_EQ(g.find_tensor("y")->offset % 32, 0u);
  EXPECT_EQ(g.find_tensor("z"), nullptr);
}

TEST(Gguf, WrongTypeAccessIsAnError) {
  const auto bytes = sample().build();
  auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
  ASSERT_TRUE(f.ok());
  auto r = f.value()->get_uint("general.architecture");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("expected an integer"), std::string::npos);
  EXPECT_FALSE(f.value()->get_uint("missing.key")->has_value());
}

// fuzz_gguf found it: a float array read as integers (token types) held -1.7e38, and the
// conversion to int64 was undefined behaviour. Out-of-range floats saturate, NaN reads as 0,
// so the caller's range check refuses them.
TEST(Gguf, FloatElementsReadAsIntegersSaturate) {
  GgufBuilder b;
  b.kv_f32_array("a", {-1.7e38f, 1e38f, std::nanf(""), 6.9f, -3.5f});
  const auto bytes = b.build();
  auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
  ASSERT_TRUE(f.ok()) << f.error().message;
  const GgufArray* a = f.value()->get_array("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->integer(0), INT64_MIN);
  EXPECT_EQ(a->integer(1), INT64_MAX);
  EXPECT_EQ(a->integer(2), 0);
  EXPECT_EQ(a->integer(3), 6);
  EXPECT_EQ(a->integer(4), -3);
}

TEST(Gguf, EveryTruncationIsACleanError) {
  const auto bytes = sample().build();
  auto full = GgufFile::from_bytes(bytes.data(), bytes.size());
  ASSERT_TRUE(full.ok());
  const GgufTensor* last = full.value()->find_tensor("y");
  // Past the last tensor's data there is only padding: cutting that leaves a valid file.
  const size_t data_end = full.value()->data_offset() + last->offset + last->nbytes;
  for (size_t n = 0; n < data_end; n++) {
    auto f = GgufFile::from_bytes(bytes.data(), n);
    ASSERT_FALSE(f.ok()) << "truncated to " << n << " bytes parsed";
    EXPECT_FALSE(f.error().message.empty());
  }
}

TEST(Gguf, BadMagic) {
  auto bytes = sample().build();
  bytes[0] = 'X';
  auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("bad magic"), std::string::npos) << f.error().message;
}

TEST(Gguf, AbsurdCountsAreRejectedBeforeAllocating) {
  auto bytes = sample().build();
  const uint64_t huge = 1ull << 60;
  auto t = bytes;
  std::memcpy(&t[8], &huge, 8);  // tensor_count
  auto f = GgufFile::from_bytes(t.data(), t.size());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("tensor_count"), std::string::npos) << f.error().message;
  auto k = bytes;
  std::memcpy(&k[16], &huge, 8);  // metadata_kv_count
  f = GgufFile::from_bytes(k.data(), k.size());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("metadata_kv_count"), std::string::npos) << f.error().message;
}

TEST(Gguf, HugeStringAndArrayLengths) {
  GgufBuilder b;
  b.kv_str("k", "value");
  auto bytes = b.build();
  // The value's length field follows magic(4) version(4) counts(16) keylen(8) "k"(1) type(4).
  const uint64_t huge = 1ull << 62;
  std::memcpy(&bytes[37], &huge, 8);
  auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("string length"), std::string::npos) << f.error().message;

  GgufBuilder a;
  a.kv_f32_array("arr", {1, 2, 3});
  auto ab = a.build();
  std::memcpy(&ab[24 + 8 + 3 + 4 + 4], &huge, 8);  // the array count
  f = GgufFile::from_bytes(ab.data(), ab.size());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("array of"), std::string::npos) << f.error().message;
}

TEST(Gguf, TensorPastEndOfFileNamesTheTensor) {
  GgufBuilder b;
  b.tensor("blk.3.attn_q.weight", DType::F32, {1024, 1024}, std::vector<uint8_t>(64));  // claims 4 MB, has 64 bytes
  const auto bytes = b.build();
  auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("blk.3.attn_q.weight"), std::string::npos) << f.error().message;
  EXPECT_NE(f.error().message.find("past the end"), std::string::npos) << f.error().message;
}

TEST(Gguf, OverlappingTensors) {
  GgufBuilder b;
  b.tensor("a", DType::F32, {16}, std::vector<uint8_t>(64));
  b.tensor("b", DType::F32, {16}, std::vector<uint8_t>(64));
  auto bytes = b.build();
  // Point b's offset at a's data: find b's info by its name and patch the offset after it.
  const std::string needle = std::string("\x01\0\0\0\0\0\0\0b", 9);
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  ASSERT_NE(it, bytes.end());
  const size_t off_pos = (it - bytes.begin()) + 9 + 4 + 8 + 4;  // name, n_dims, dim, type
  const uint64_t zero = 0;
  std::memcpy(&bytes[off_pos], &zero, 8);
  auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("overlap"), std::string::npos) << f.error().message;
}

TEST(Gguf, MisalignedOffsetUnknownTypeAndBadDims) {
  auto patch_tensor = [](size_t field_from_name_end, const void* v, size_t n) {
    GgufBuilder b;
    b.tensor("t", DType::F32, {8}, std::vector<uint8_t>(32));
    auto bytes = b.build();
    const std::string needle = std::string("\x01\0\0\0\0\0\0\0t", 9);
    auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
    std::memcpy(&bytes[(it - bytes.begin()) + 9 + field_from_name_end], v, n);
    return GgufFile::from_bytes(bytes.data(), bytes.size());
  };
  const uint64_t odd = 4;
  auto f = patch_tensor(4 + 8 + 4, &odd, 8);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("alignment"), std::string::npos) << f.error().message;
  const uint32_t bad_type = 99;
  f = patch_tensor(4 + 8, &bad_type, 4);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("unknown tensor type"), std::string::npos) << f.error().message;
  const uint32_t dims = 9;
  f = patch_tensor(0, &dims, 4);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("n_dims"), std::string::npos) << f.error().message;
  const uint64_t zero_dim = 0;
  f = patch_tensor(4, &zero_dim, 8);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("dimension"), std::string::npos) << f.error().message;
}

TEST(Gguf, QuantRowLengthMustFillBlocks) {
  GgufBuilder b;
  b.tensor("q", DType::Q8_0, {40, 1}, std::vector<uint8_t>(68));
  const auto bytes = b.build();
  auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("block size"), std::string::npos) << f.error().message;
}

TEST(Gguf, DuplicateKeysAndBadBool) {
  GgufBuilder b;
  b.kv_u32("k", 1);
  b.kv_u32("k", 2);
  auto bytes = b.build();
  auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("twice"), std::string::npos);

  GgufBuilder c;
  c.kv_bool("flag", true);
  auto cb = c.build();
  cb[24 + 8 + 4 + 4] = 7;  // the bool byte: after the header, key length, "flag" and type
  f = GgufFile::from_bytes(cb.data(), cb.size());
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("bool"), std::string::npos) << f.error().message;
}

TEST(Gguf, OpenReportsMissingFile) {
  auto f = GgufFile::open("/nonexistent/model.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().message.find("cannot open"), std::string::npos);
}

TEST(Gguf, RandomCorruptionNeverCrashes) {
  const auto good = sample().build();
  uint64_t s = 12345;
  for (int trial = 0; trial < 3000; trial++) {
    auto bytes = good;
    for (int k = 0; k < 4; k++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      bytes[(s >> 33) % bytes.size()] = (uint8_t)(s >> 13);
    }
    auto f = GgufFile::from_bytes(bytes.data(), bytes.size());
    if (f.ok()) {  // whatever parsed must lie inside the file
      for (const auto& t : f.value()->tensors())
        EXPECT_LE(f.value()->data_offset() + t.offset + t.nbytes, f.value()->file_size());
    }
  }
}

}  // namespace
}  // namespace tandem
