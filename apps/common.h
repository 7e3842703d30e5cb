// Helpers shared by the CLI subcommands (the only layer that prints errors and exits).
#pragma once

#include <memory>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace tandem {
class LlamaModel;
}

namespace tandem::apps {

// Prints "error: msg" to stderr and returns the exit code 1.
int fail(const std::string& msg);

// The CPU backend for the command line's options: kernel level ("auto", "avx2", ...),
// threads (0 = all cores), 8-bit or float activations, and a comma-separated list of weight
// name parts whose products stay on float activations (--exact-products).
Result<std::shared_ptr<CpuBackend>> make_cpu_backend(const std::string& isa, int threads, bool quantized_activations,
                                                     const std::string& exact_products = "");
// The CPU backend a model runs on, or null when it runs on another (a GPU).
const CpuBackend* cpu_backend(const LlamaModel& m);

}  // namespace tandem::apps
