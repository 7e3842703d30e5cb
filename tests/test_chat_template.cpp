// Chat templates: tandem's Jinja subset against Python jinja2's output (configured as
// transformers configures it) for each family's template and for Jinja features one by one.
// Expected strings: tests/data/chat_templates/expected.json, from
// tests/reference/make_chat_expected.py.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gguf/gguf_file.h"
#include "test_paths.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/parser.h"
#include "tokenizer/tokenizer.h"

namespace tandem {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string data_dir() { return std::string(TANDEM_SOURCE_DIR) + "/tests/data/chat_templates"; }

const nlohmann::ordered_json& expected() {
  static const nlohmann::ordered_json j = nlohmann::ordered_json::parse(slurp(data_dir() + "/expected.json"));
  return j;
}

// Renders a template source with a JSON context, or returns "ERROR: message".
std::string render_snippet(const std::string& source, const nlohmann::ordered_json& context) {
  try {
    jinja::Object ctx;
    for (auto it = context.begin(); it != context.end(); ++it) ctx.emplace_back(it.key(), jinja::Value::from_json(*it, 128));
    return jinja::render(jinja::parse_template(source), ctx).text;
  } catch (const jinja::Error& e) {
    return std::string("ERROR: ") + e.what();
  }
}

TEST(ChatTemplate, EveryFamilyMatchesJinja2) {
  int checked = 0;
  for (const auto& c : expected()["cases"]) {
    const std::string name = c["template"];
    const std::string label = name + " / " + c["conversation"].get<std::string>() +
                              (c["add_generation_prompt"].get<bool>() ? " +generation prompt" : "");
    auto t = ChatTemplate::from_source(slurp(data_dir() + "/" + name + ".jinja"), c["bos_token"], c["eos_token"]);
    ASSERT_TRUE(t.ok()) << label << ": " << t.error().message;
    const nlohmann::ordered_json& extra = c["extra"];
    auto out = t->render_json(c["messages"], c["add_generation_prompt"], &extra);
    if (c.contains("error")) {
      ASSERT_FALSE(out.ok()) << label << " should fail";
      EXPECT_NE(out.error().message.find(c["error"].get<std::string>()), std::string::npos)
          << label << ": " << out.error().message;
    } else {
      ASSERT_TRUE(out.ok()) << label << ": " << out.error().message;
      EXPECT_EQ(out->text, c["expected"].get<std::string>()) << label;
    }
    checked++;
  }
  EXPECT_GE(checked, 100);
}

TEST(ChatTemplate, JinjaFeaturesMatchJinja2) {
  for (const auto& s : expected()["snippets"]) {
    const std::string got = render_snippet(s["source"], s["context"]);
    if (s.contains("error")) {
      EXPECT_NE(got.find(s["error"].get<std::string>()), std::string::npos) << s["name"] << ": " << got;
    } else {
      EXPECT_EQ(got, s["expected"].get<std::string>()) << s["name"];
    }
  }
}

TEST(ChatTemplate, UnsupportedTemplateIsAnErrorNamingIt) {
  auto bad = ChatTemplate::from_source("{% filter upper %}x{% endfilter %}", "", "");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("{% filter"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("line 1"), std::string::npos) << bad.error().message;
  for (const char* src : {"{{ unclosed", "{% if x %}no end", "{{ 'a' + }}", "{% for in xs %}{% endfor %}", "{{ x | nosuchfilter }}"}) {
    auto t = ChatTemplate::from_source(src, "", "");
    if (t.ok()) {
      auto r = t->render({{"user", "hi"}}, true);
      EXPECT_FALSE(r.ok()) << src;
    }
  }
}

TEST(ChatTemplate, HostileTemplatesStopWithAnError) {
  for (const char* src : {"{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
                          "{{ 'x' * 1000000000 }}", "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
                          "{% for i in range(10000000000) %}{% endfor %}"}) {
    auto t = ChatTemplate::from_source(src, "", "");
    ASSERT_TRUE(t.ok()) << src;
    auto r = t->render({}, false);
    EXPECT_FALSE(r.ok()) << src;
  }
}

TEST(ChatTemplate, SmolLm2FromTheModelFile) {
  const std::string path = test::default_model_path();
  if (!test::exists(path)) GTEST_SKIP() << "model not found at " << path << " (run scripts/setup.sh)";
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  auto tok = Tokenizer::from_gguf(*f.value());
  ASSERT_TRUE(tok.ok());
  auto t = ChatTemplate::from_gguf(*f.value(), tok.value()->vocab());
  ASSERT_TRUE(t.ok()) << t.error().message;
  auto text = t->render({{"user", "Hi"}}, true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->text,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const auto ids = tok.value()->encode_chat(text.value());
  EXPECT_EQ(ids.front(), 1);  // <|im_start|>, no BOS: SmolLM2 does not add one
}

TEST(ChatTemplate, TemplateWrittenBosIsNotDoubled) {
  const std::string path = test::shared_dir() + "/tokenizer-vectors/ggml-vocab-phi-3.gguf";
  if (!test::exists(path)) GTEST_SKIP() << "vocab not found at " << path;
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  auto tok = Tokenizer::from_gguf(*f.value());
  ASSERT_TRUE(tok.ok());
  const Vocab& v = tok.value()->vocab();
  auto t = ChatTemplate::from_gguf(*f.value(), v);
  ASSERT_TRUE(t.ok()) << t.error().message;
  auto text = t->render({{"user", "Hi"}}, true);
  ASSERT_TRUE(text.ok());
  ASSERT_EQ(text->text.rfind(v.tokens[v.bos], 0), 0u) << text->text;  // the template writes {{ bos_token }}
  const auto ids = tok.value()->encode_chat(text.value());
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], v.bos);
  EXPECT_NE(ids[1], v.bos);
}

}  // namespace
}  // namespace tandem
