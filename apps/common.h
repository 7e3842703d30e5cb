// Helpers shared by the CLI subcommands (the only layer that prints errors and exits).
#pragma once

#include <string>

namespace tandem::apps {

// Prints "error: msg" to stderr and returns the exit code 1.
int fail(const std::string& msg);
// Sets the OpenMP thread count; 0 keeps the default (all cores).
void set_threads(int n);

}  // namespace tandem::apps

namespace tandem::apps {
// Threads OpenMP will use for the next parallel region.
int omp_threads();
}  // namespace tandem::apps
