// Subcommands of the tandem CLI. Each registers its options on the app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>

namespace tandem::apps {

// Registers a subcommand; the returned callback runs it and yields the process exit code.
using Command = std::function<int()>;
Command add_run_command(CLI::App& app);    // run, chat
Command add_chat_command(CLI::App& app);
Command add_logits_command(CLI::App& app);
Command add_info_command(CLI::App& app);
Command add_tokenize_command(CLI::App& app);
Command add_template_command(CLI::App& app);
Command add_kv_command(CLI::App& app);
Command add_explain_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_serve_command(CLI::App& app);
Command add_perplexity_command(CLI::App& app);

// Registers subcommand `name`: add_options declares its options into an Args, and the returned
// callback runs it on what the command line gave them.
template <typename Args>
Command subcommand(CLI::App& app, const char* name, const char* about, void (*add_options)(CLI::App*, Args&),
                   int (*run)(const Args&)) {
  auto a = std::make_shared<Args>();
  add_options(app.add_subcommand(name, about), *a);
  return [a, run]() -> int { return run(*a); };
}

}  // namespace tandem::apps
