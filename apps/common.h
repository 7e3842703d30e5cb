// Helpers shared by the CLI subcommands (the only layer that prints errors and exits).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace tandem {
class Model;
}

namespace tandem::apps {

// Prints "error: msg" to stderr and returns the exit code 1.
int fail(const std::string& msg);

// The CPU backend a model runs on, or null when it runs on another (a GPU).
const CpuBackend* cpu_backend(const Model& m);

}  // namespace tandem::apps
