// The parsed form of a template: statement nodes holding expression trees.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/value.h"

namespace tandem::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
using KwArgs = std::vector<std::pair<std::string, ExprPtr>>;

struct Expr {
  enum class Kind { Literal, Name, List, Dict, Attr, Index, Slice, Call, Filter, Test, Unary, Binary, Ternary };
  Kind kind;
  int line = 0;
  int depth = 1;                // levels of expression below and including this one (bounded by the parser)
  Value literal;                // Literal
  std::string name;             // Name; Attr member; Filter/Test name; Unary/Binary operator
  std::vector<ExprPtr> items;   // List items; Dict keys and values interleaved; call/filter/test args
  KwArgs kwargs;                // call/filter/test keyword args
  ExprPtr a, b, c, d;           // operands: Attr/Index/Slice object a, index b (slice b:c:d);
                                // Ternary: a if b else c (c may be null)
  bool negated = false;         // Test: `is not`
  explicit Expr(Kind k) : kind(k) {}
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Scope };
  Kind kind;
  int line = 0;
  std::string text;                                  // Text; Set/SetBlock/Macro name
  std::string attr;                                  // Set: `set ns.attr = ...`
  ExprPtr expr;                                      // Output; Set value; For iterable
  ExprPtr cond;                                      // For: `for x in xs if cond`
  std::vector<std::string> targets;                  // For loop variables; Set tuple targets
  std::vector<std::pair<ExprPtr, Body>> branches;    // If: conditions (null for else) and bodies
  Body body, else_body;                              // For body/else; SetBlock, Macro and Scope bodies
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro parameters and defaults
  explicit Node(Kind k) : kind(k) {}
};

}  // namespace tandem::jinja
