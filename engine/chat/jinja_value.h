// The values a chat template computes with, and their Python semantics.
//
// Jinja evaluates expressions with Python objects; a template's output depends on Python's rules for them:
// truthiness, str() and repr() (`{{ [1, 'a'] }}` prints "[1, 'a']"), == across int/float/bool, ordering, int vs
// float arithmetic. Value models the Python types a Hugging Face chat template meets (None, bool, int, float, str,
// list, tuple, dict, dict views, range, one-shot iterators, Jinja's Undefined, namespace, loop, callables) and this
// header's free functions implement those rules (sources: the Python 3.11 language reference and the builtin
// types' documentation; Jinja 3.1's runtime.Undefined for the undefined value).
//
// Values are immutable and cheap to copy (containers and strings are shared), except the two objects Jinja lets a
// template change: a namespace's attributes and a loop's position. Integers are 64-bit; where Python's integers
// would grow beyond that, evaluation fails (FAILED_PRECONDITION) rather than wrap.
#ifndef DECODED_ENGINE_CHAT_JINJA_VALUE_H_
#define DECODED_ENGINE_CHAT_JINJA_VALUE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/chat/jinja_budget.h"
#include "engine/chat/tainted_string.h"

namespace decoded::jinja {

class Value;
class Dict;
class Namespace;
class LoopContext;
class Callable;
struct IteratorState;
struct RangeSpec;

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kDict,
  kDictItems,   // dict.items()
  kDictKeys,    // dict.keys()
  kDictValues,  // dict.values()
  kRange,
  kIterator,  // a one-shot iterator: what map/select/reject/unique/items/reverse return
  kNamespace,
  kLoop,
  kCallable,
};

class Value {
 public:
  // Undefined with Jinja's generic message.
  Value();
  // Jinja's Undefined: renders as "", is falsy and iterates as empty; any other use fails with `message`.
  static Value Undefined(std::string message);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  // `html_safe`: a markupsafe.Markup string (from the safe/escape filters); `+` HTML-escapes a plain str operand
  // joined to it, as Markup.__add__/__radd__ do.
  static Value String(TaintedString s, bool html_safe = false);
  // A string of template markup (no data).
  static Value Markup(std::string s);
  // Containers fail (FAILED_PRECONDITION) when nested deeper than Limits::kMaxValueDepth.
  static absl::StatusOr<Value> List(std::vector<Value> items);
  static absl::StatusOr<Value> Tuple(std::vector<Value> items);
  static absl::StatusOr<Value> DictOf(Dict dict);
  static Value DictView(Kind view, std::shared_ptr<const Dict> dict);
  static Value Range(int64_t start, int64_t stop, int64_t step, std::vector<Value> items);
  static Value Iterator(std::vector<Value> items, std::string type_name);
  static Value NamespaceObject(std::shared_ptr<Namespace> ns);
  static Value Loop(std::shared_ptr<LoopContext> loop);
  static Value Function(std::shared_ptr<const Callable> fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  // bool, int or float (Python's numbers.Number, bool included).
  bool is_number() const { return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  // int or bool: Python's bool is an int.
  bool is_integral() const { return kind_ == Kind::kBool || kind_ == Kind::kInt; }
  bool is_list_or_tuple() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }

  const std::string& undefined_message() const;
  bool bool_value() const { return std::get<bool>(data_); }
  // int or bool.
  int64_t int_value() const;
  // Any number as a double.
  double float_value() const;
  const TaintedString& string() const { return *std::get<StringPtr>(data_); }
  bool html_safe() const { return html_safe_; }
  // The items of a list, tuple, range or iterator (all of them, consumed or not).
  const std::vector<Value>& items() const;
  // A dict's entries, or the dict a view looks at.
  const Dict& dict() const { return *std::get<DictPtr>(data_); }
  std::shared_ptr<const Dict> dict_ptr() const { return std::get<DictPtr>(data_); }
  const RangeSpec& range() const { return *std::get<RangePtr>(data_); }
  IteratorState& iterator() const { return *std::get<IteratorPtr>(data_); }
  Namespace& ns() const { return *std::get<NamespacePtr>(data_); }
  LoopContext& loop() const { return *std::get<LoopPtr>(data_); }
  const Callable& callable() const { return *std::get<CallablePtr>(data_); }
  std::shared_ptr<const Callable> callable_ptr() const { return std::get<CallablePtr>(data_); }

  // Nesting depth of lists/tuples/dicts (0 for scalars; namespaces, loops and callables count as 1).
  int depth() const;
  // Identity of the shared object behind a reference value (namespaces, callables, iterators), for `is sameas`.
  const void* identity() const;

 private:
  struct Sequence {
    std::vector<Value> items;
    int depth = 1;
  };
  using StringPtr = std::shared_ptr<const TaintedString>;
  using SequencePtr = std::shared_ptr<const Sequence>;
  using DictPtr = std::shared_ptr<const Dict>;
  using RangePtr = std::shared_ptr<const RangeSpec>;
  using IteratorPtr = std::shared_ptr<IteratorState>;
  using NamespacePtr = std::shared_ptr<Namespace>;
  using LoopPtr = std::shared_ptr<LoopContext>;
  using CallablePtr = std::shared_ptr<const Callable>;

  explicit Value(Kind kind) : kind_(kind) {}
  static absl::StatusOr<Value> MakeSequence(Kind kind, std::vector<Value> items);

  Kind kind_;
  bool html_safe_ = false;
  std::variant<std::monostate, bool, int64_t, double, StringPtr, SequencePtr, DictPtr, RangePtr, IteratorPtr,
               NamespacePtr, LoopPtr, CallablePtr>
      data_;
};

// An insertion-ordered dict with Python key equality (1 == 1.0 == True are one key). Keys must be hashable: None,
// bool, int, float, str, or tuples of those.
class Dict {
 public:
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  // nullptr when absent (an unhashable key is simply absent).
  const Value* Find(const Value& key) const;
  // Find(a str key), without building a Value.
  const Value* FindString(std::string_view key) const;
  // Inserts or replaces the value (a replaced key keeps its first spelling and position, as in Python).
  // FAILED_PRECONDITION "unhashable type: 'list'" for an unhashable key.
  absl::Status Set(Value key, Value value);
  int depth() const;

 private:
  // Small dicts (messages have two keys) are searched linearly; larger ones get a hash index.
  static constexpr size_t kIndexAt = 8;
  const Value* FindLinear(const Value& key) const;

  std::vector<std::pair<Value, Value>> entries_;
  absl::flat_hash_map<std::string, size_t> index_;  // empty until the dict outgrows kIndexAt
};

struct RangeSpec {
  int64_t start, stop, step;
  std::vector<Value> items;
};

// The state of a one-shot iterator: iterating consumes it, as in Python, so a filter result iterated twice is empty
// the second time.
struct IteratorState {
  std::vector<Value> items;
  size_t position = 0;
  std::string type_name;  // "generator", "list_reverseiterator"
};

// Jinja's namespace(): the one object whose attributes a template may assign ({% set ns.x = ... %}).
class Namespace {
 public:
  Dict& attrs() { return attrs_; }
  const Dict& attrs() const { return attrs_; }

 private:
  Dict attrs_;
};

// Jinja's `loop` variable inside a for loop.
class LoopContext {
 public:
  LoopContext(std::vector<Value> items) : items_(std::move(items)) {}
  const std::vector<Value>& items() const { return items_; }
  size_t index0() const { return index0_; }
  void set_index0(size_t i) { index0_ = i; }
  // loop.changed(*values): true when the values (a tuple) differ from the previous call's (and on the first call).
  bool Changed(const Value& values);
  // Drops the items and remembered values (breaking reference cycles when a render ends).
  void Clear() {
    items_.clear();
    last_changed_.clear();
  }

 private:
  std::vector<Value> items_;
  size_t index0_ = 0;
  bool has_last_changed_ = false;
  std::vector<Value> last_changed_;
};

// Arguments of a call, as written: f(a, b, key=value).
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

// What builtins need from the render in progress.
struct Env {
  Budget* budget;
  absl::Time now;
};

// Anything a template can call: macros, global functions, bound methods, loop.cycle.
class Callable {
 public:
  virtual ~Callable() = default;
  // "macro 'name'", "method str.split" ...: names the callee in error messages.
  virtual std::string Describe() const = 0;
  virtual absl::StatusOr<Value> Call(Env& env, CallArgs args) const = 0;
};

// Python's type(x).__name__ ("str", "NoneType", "dict_items", ...).
const char* TypeName(const Value& v);
// Jinja's object_type_repr: "None", or "<type> object" ("dict object").
std::string ObjectTypeRepr(const Value& v);

// bool(x). Undefined is false, iterators and callables true.
bool Truthy(const Value& v);
// x == y with Python semantics (Undefined equals only Undefined).
bool Equals(const Value& a, const Value& b);
// x < y; FAILED_PRECONDITION "'<' not supported between instances of 'int' and 'str'" when unordered.
absl::StatusOr<bool> Less(const Value& a, const Value& b);
// len(x); FAILED_PRECONDITION "object of type 'int' has no len()".
absl::StatusOr<int64_t> Length(const Value& v);

// str(x) as Jinja prints it: strings keep their data ranges; Undefined is ""; any other value containing data is
// all data. FAILED_PRECONDITION for values whose Python str() shows a memory address (callables, iterators, loop).
absl::StatusOr<TaintedString> ToStr(const Value& v);
// repr(x); same failures.
absl::StatusOr<std::string> Repr(const Value& v);
// Whether any string inside `v` carries data (for conservative tainting of derived strings).
bool HasData(const Value& v);
// Python repr of a float ("1.0", "1e+16", "inf").
std::string FloatRepr(double d);
// Python repr of a str ('it\'s' -> "it's").
std::string StringRepr(std::string_view s);

// Iterating x in a for loop or filter: the items, or FAILED_PRECONDITION "'int' object is not iterable".
// Undefined iterates as empty; a str as its characters (each keeping its data ranges); a dict as its keys;
// iterating an iterator consumes it.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);

}  // namespace decoded::jinja

#endif  // DECODED_ENGINE_CHAT_JINJA_VALUE_H_
