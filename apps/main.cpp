// tandem: a C++20 LLM inference engine with prefill and decode as first-class phases.
#include <fmt/core.h>

#include <map>

#include "apps/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tandem: LLM inference with prefill and decode as first-class phases"};
  app.require_subcommand(1);
  std::map<CLI::App*, tandem::apps::Command> commands;
  auto add = [&](tandem::apps::Command (*f)(CLI::App&)) {
    const size_t before = app.get_subcommands({}).size();
    tandem::apps::Command cmd = f(app);
    commands[app.get_subcommands({})[before]] = std::move(cmd);
  };
  add(tandem::apps::add_run_command);
  add(tandem::apps::add_chat_command);
  add(tandem::apps::add_tokenize_command);
  add(tandem::apps::add_template_command);
  add(tandem::apps::add_info_command);
  add(tandem::apps::add_logits_command);
  add(tandem::apps::add_kv_command);
  add(tandem::apps::add_explain_command);
  add(tandem::apps::add_bench_command);
  add(tandem::apps::add_serve_command);
  add(tandem::apps::add_perplexity_command);
  CLI11_PARSE(app, argc, argv);
  for (auto& [sub, run] : commands)
    if (sub->parsed()) return run();
  return 1;
}
