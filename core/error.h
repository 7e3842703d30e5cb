// Errors as values: library code returns Result<T>; only apps/ decides to exit.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace tandem {

struct Error {
  std::string message;
};

// Builds an Error with fmt-style formatting: make_error("tensor {}: offset {} past end", name, off).
template <typename... Args>
Error make_error(fmt::format_string<Args...> f, Args&&... args) {
  return Error{fmt::format(f, std::forward<Args>(args)...)};
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}    // NOLINT: implicit by design

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Result<void> equivalent.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  static Status Ok() { return {}; }
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

}  // namespace tandem

// Propagates an error from an expression returning Status or Result<T>.
#define TANDEM_TRY(expr)                                  \
  do {                                                    \
    auto&& tandem_try_r_ = (expr);                        \
    if (!tandem_try_r_.ok()) return tandem_try_r_.error(); \
  } while (0)
