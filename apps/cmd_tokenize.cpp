// `tandem tokenize`: text on stdin -> token ids or pieces, for any GGUF with a vocabulary.
#include <algorithm>
#include <iostream>
#include <iterator>

#include <fmt/core.h>

#include "apps/commands.h"
#include "apps/common.h"
#include "gguf/gguf_file.h"
#include "core/timer.h"
#include "tokenizer/tokenizer.h"

namespace tandem::apps {

Command add_tokenize_command(CLI::App& app) {
  struct Args {
    std::string model;
    bool ids = false, no_bos = false, parse_special = false, stats = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* sub = app.add_subcommand("tokenize", "Tokenize text from stdin with a model's (or vocab-only GGUF's) vocabulary");
  sub->add_option("-m,--model", a->model, "GGUF file with a tokenizer")->required();
  sub->add_flag("--ids", a->ids, "print only the ids, space-separated");
  sub->add_flag("--no-bos", a->no_bos, "do not add BOS/EOS");
  sub->add_flag("--special", a->parse_special, "match special-token text such as <|im_start|>");
  sub->add_flag("--stats", a->stats, "print bytes, tokens and tokenizing speed to stderr");
  return [a]() -> int {
    auto f = GgufFile::open(a->model);
    if (!f.ok()) return fail(f.error().message);
    auto tok = Tokenizer::from_gguf(*f.value());
    if (!tok.ok()) return fail(tok.error().message);
    const std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    Timer timer;
    const auto ids = tok.value()->encode(text, !a->no_bos, a->parse_special);
    const double seconds = timer.seconds();
    if (a->stats)
      fmt::print(stderr, "{} bytes -> {} tokens in {:.3f} s ({:.2f} MB/s, {:.2f} bytes/token)\n", text.size(), ids.size(), seconds,
                 text.size() / 1e6 / std::max(seconds, 1e-9), ids.empty() ? 0.0 : (double)text.size() / ids.size());
    if (a->ids) {
      for (size_t i = 0; i < ids.size(); i++) fmt::print("{}{}", i ? " " : "", ids[i]);
      fmt::print("\n");
    } else {
      for (int32_t id : ids) fmt::print("{:>7} {:?}\n", id, tok.value()->token_to_piece(id, true));
    }
    return 0;
  };
}

}  // namespace tandem::apps
