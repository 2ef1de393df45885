#include "engine/chat/jinja_eval.h"

#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/time/civil_time.h"
#include "engine/chat/jinja_args.h"
#include "engine/chat/jinja_operators.h"
#include "engine/chat/jinja_status.h"

namespace decoded::jinja {
namespace {

// Marks a status whose message is final (already carries its line, or is the template's own raise_exception
// message), so enclosing nodes do not annotate it again.
constexpr char kLocatedPayload[] = "decoded.chat_template/located";

bool IsLocated(const absl::Status& s) { return s.GetPayload(kLocatedPayload).has_value(); }

absl::Status MarkLocated(absl::Status s) {
  s.SetPayload(kLocatedPayload, absl::Cord("1"));
  return s;
}

absl::Status Locate(const absl::Status& s, int line) {
  if (s.ok() || IsLocated(s)) return s;
  return MarkLocated(absl::Status(s.code(), absl::StrCat("chat template: ", s.message(), " (line ", line, ")")));
}

// A scope: the variables assigned in it, and the scope it reads through to. Most scopes (a loop iteration, a macro
// call) hold a handful of names, so they are a small vector; a scope that grows past kIndexAt names gets an index.
class Frame {
 public:
  explicit Frame(std::shared_ptr<Frame> parent) : parent_(std::move(parent)) {}

  const Value* Find(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent_.get()) {
      if (const Value* v = f->FindLocal(name)) return v;
    }
    return nullptr;
  }
  void Set(const std::string& name, Value v) {
    if (const Value* existing = FindLocal(name)) {
      *const_cast<Value*>(existing) = std::move(v);
      return;
    }
    vars_.emplace_back(name, std::move(v));
    if (index_ != nullptr) {
      index_->emplace(name, vars_.size() - 1);
    } else if (vars_.size() > kIndexAt) {
      index_ = std::make_unique<absl::flat_hash_map<std::string, size_t>>();
      for (size_t i = 0; i < vars_.size(); ++i) index_->emplace(vars_[i].first, i);
    }
  }
  // Drops everything the frame holds, breaking reference cycles (a macro stored in the frame it closes over).
  void Clear() {
    vars_.clear();
    index_.reset();
    parent_.reset();
  }

 private:
  static constexpr size_t kIndexAt = 16;

  const Value* FindLocal(const std::string& name) const {
    if (index_ != nullptr) {
      auto it = index_->find(name);
      return it == index_->end() ? nullptr : &vars_[it->second].second;
    }
    for (const auto& [n, v] : vars_) {
      if (n == name) return &v;
    }
    return nullptr;
  }

  absl::InlinedVector<std::pair<std::string, Value>, 4> vars_;
  std::unique_ptr<absl::flat_hash_map<std::string, size_t>> index_;
  std::shared_ptr<Frame> parent_;
};
using FramePtr = std::shared_ptr<Frame>;

class Interpreter;

// A macro, or the caller of a call block: a body rendered in a new scope over `closure`.
class MacroFunction : public Callable {
 public:
  MacroFunction(Interpreter* interp, const Stmt* def, FramePtr closure, std::string name)
      : interp_(interp), def_(def), closure_(std::move(closure)), name_(std::move(name)) {}

  std::string Describe() const override { return absl::StrCat("macro '", name_, "'"); }
  absl::StatusOr<Value> Call(Env& env, CallArgs args) const override;

  const Stmt& def() const { return *def_; }
  const FramePtr& closure() const { return closure_; }
  const std::string& name() const { return name_; }

 private:
  Interpreter* interp_;
  const Stmt* def_;
  FramePtr closure_;
  std::string name_;
};

enum class Global { kRaiseException, kStrftimeNow, kNamespace, kDict, kRange };

class GlobalFunction : public Callable {
 public:
  GlobalFunction(Interpreter* interp, Global which, std::string name)
      : interp_(interp), which_(which), name_(std::move(name)) {}
  std::string Describe() const override { return absl::StrCat("function '", name_, "'"); }
  absl::StatusOr<Value> Call(Env& env, CallArgs args) const override;

 private:
  Interpreter* interp_;
  Global which_;
  std::string name_;
};

absl::StatusOr<std::string> Strftime(std::string_view format, absl::Time now);

class Interpreter {
 public:
  explicit Interpreter(absl::Time now) : env_{&budget_, now} {
    for (auto [name, which] : {std::pair{"raise_exception", Global::kRaiseException},
                               std::pair{"strftime_now", Global::kStrftimeNow},
                               std::pair{"namespace", Global::kNamespace}, std::pair{"dict", Global::kDict},
                               std::pair{"range", Global::kRange}}) {
      globals_.emplace(name, Value::Function(std::make_shared<GlobalFunction>(this, which, name)));
    }
  }

  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Objects a template can mutate may end up referring to themselves; emptying them frees the cycles.
  ~Interpreter() {
    for (const auto& ns : namespaces_) ns->attrs() = Dict();
    for (const auto& loop : loops_) loop->Clear();
    for (const auto& frame : closures_) frame->Clear();
  }

  absl::StatusOr<TaintedString> Render(const Template& tpl, const std::vector<std::pair<std::string, Value>>& context) {
    auto root = std::make_shared<Frame>(nullptr);
    closures_.push_back(root);
    for (const auto& [name, value] : context) root->Set(name, value);
    out_.emplace_back();
    JINJA_RETURN_IF_ERROR(Exec(tpl.body, root));
    return std::move(out_.back());
  }

  Env& env() { return env_; }

  absl::StatusOr<Value> CallMacro(const MacroFunction& macro, CallArgs args);

  Value NewNamespace(Dict attrs) {
    auto ns = std::make_shared<Namespace>();
    ns->attrs() = std::move(attrs);
    namespaces_.push_back(ns);
    return Value::NamespaceObject(std::move(ns));
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // Bounds interpreter recursion (expression nesting, statement nesting, calls).
  class DepthGuard {
   public:
    explicit DepthGuard(Interpreter* in) : in_(in) { ++in_->depth_; }
    ~DepthGuard() { --in_->depth_; }
    absl::Status Check() const {
      if (in_->depth_ > Limits::kMaxEvalDepth) {
        return absl::FailedPreconditionError(
            absl::StrCat("evaluation nested deeper than ", Limits::kMaxEvalDepth, " levels"));
      }
      return absl::OkStatus();
    }

   private:
    Interpreter* in_;
  };

  absl::Status Emit(const TaintedString& s) {
    TaintedString& out = out_.back();
    JINJA_RETURN_IF_ERROR(budget_.ChargeAppend(out.size() + s.size(), s.size()));
    out.Append(s);
    return absl::OkStatus();
  }

  // Renders `body` into a fresh buffer and returns it.
  absl::StatusOr<TaintedString> Capture(const Body& body, const FramePtr& frame) {
    out_.emplace_back();
    absl::Status s = Exec(body, frame);
    TaintedString captured = std::move(out_.back());
    out_.pop_back();
    if (!s.ok()) return s;
    return captured;
  }

  absl::Status Exec(const Body& body, const FramePtr& frame) {
    for (const StmtPtr& stmt : body) {
      JINJA_RETURN_IF_ERROR(ExecStmt(*stmt, frame));
      if (flow_ != Flow::kNormal) break;
    }
    return absl::OkStatus();
  }

  absl::Status ExecStmt(const Stmt& s, const FramePtr& frame) {
    DepthGuard guard(this);
    absl::Status status = guard.Check();
    if (status.ok()) status = budget_.Step();
    if (status.ok()) status = ExecStmtImpl(s, frame);
    return Locate(status, s.line);
  }

  absl::Status ExecStmtImpl(const Stmt& s, const FramePtr& frame) {
    switch (s.kind) {
      case StmtKind::kText:
        return Emit(TaintedString(s.text));
      case StmtKind::kPrint: {
        JINJA_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, frame));
        JINJA_ASSIGN_OR_RETURN(TaintedString text, ToStr(v));
        return Emit(text);
      }
      case StmtKind::kIf: {
        JINJA_ASSIGN_OR_RETURN(Value test, Eval(*s.expr, frame));
        return Exec(Truthy(test) ? s.body : s.else_body, frame);
      }
      case StmtKind::kFor:
        return ExecFor(s, frame);
      case StmtKind::kSet: {
        JINJA_ASSIGN_OR_RETURN(Value v, Eval(*s.expr, frame));
        return Assign(s.target, std::move(v), frame);
      }
      case StmtKind::kSetBlock: {
        JINJA_ASSIGN_OR_RETURN(TaintedString body, Capture(s.body, frame));
        Value v = Value::String(std::move(body));
        if (s.expr) {
          JINJA_ASSIGN_OR_RETURN(v, ApplyFilterChain(*s.expr, std::move(v), frame));
        }
        return Assign(s.target, std::move(v), frame);
      }
      case StmtKind::kMacro: {
        closures_.push_back(frame);
        frame->Set(s.text, Value::Function(std::make_shared<MacroFunction>(this, &s, frame, s.text)));
        return absl::OkStatus();
      }
      case StmtKind::kCallBlock: {
        closures_.push_back(frame);
        Value caller = Value::Function(std::make_shared<MacroFunction>(this, &s, frame, "caller"));
        JINJA_ASSIGN_OR_RETURN(Value v, EvalCall(*s.expr, frame, &caller));
        JINJA_ASSIGN_OR_RETURN(TaintedString text, ToStr(v));
        return Emit(text);
      }
      case StmtKind::kFilterBlock: {
        JINJA_ASSIGN_OR_RETURN(TaintedString body, Capture(s.body, frame));
        JINJA_ASSIGN_OR_RETURN(Value v, ApplyFilterChain(*s.expr, Value::String(std::move(body)), frame));
        JINJA_ASSIGN_OR_RETURN(TaintedString text, ToStr(v));
        return Emit(text);
      }
      case StmtKind::kWith: {
        auto inner = std::make_shared<Frame>(frame);
        std::vector<Value> values;
        for (const auto& [target, value] : s.with_assignments) {
          JINJA_ASSIGN_OR_RETURN(Value v, Eval(*value, frame));
          values.push_back(std::move(v));
        }
        for (size_t i = 0; i < values.size(); ++i) {
          JINJA_RETURN_IF_ERROR(Assign(s.with_assignments[i].first, std::move(values[i]), inner));
        }
        return Exec(s.body, inner);
      }
      case StmtKind::kBreak:
        flow_ = Flow::kBreak;
        return absl::OkStatus();
      case StmtKind::kContinue:
        flow_ = Flow::kContinue;
        return absl::OkStatus();
      case StmtKind::kGeneration:
        return Exec(s.body, std::make_shared<Frame>(frame));
    }
    return absl::InternalError("unknown statement");
  }

  absl::Status ExecFor(const Stmt& s, const FramePtr& frame) {
    JINJA_ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr, frame));
    JINJA_RETURN_IF_ERROR(ChargeOperand(iterable));
    JINJA_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(iterable));
    if (s.condition) {
      std::vector<Value> kept;
      for (Value& item : items) {
        JINJA_RETURN_IF_ERROR(budget_.Step());
        auto scope = std::make_shared<Frame>(frame);
        JINJA_RETURN_IF_ERROR(Assign(s.target, item, scope));
        JINJA_ASSIGN_OR_RETURN(Value keep, Eval(*s.condition, scope));
        if (Truthy(keep)) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) return Exec(s.else_body, std::make_shared<Frame>(frame));
    auto loop = std::make_shared<LoopContext>(std::move(items));
    loops_.push_back(loop);
    const Value loop_value = Value::Loop(loop);
    for (size_t i = 0; i < loop->items().size(); ++i) {
      JINJA_RETURN_IF_ERROR(budget_.Step());
      loop->set_index0(i);
      auto scope = std::make_shared<Frame>(frame);
      JINJA_RETURN_IF_ERROR(Assign(s.target, loop->items()[i], scope));
      scope->Set("loop", loop_value);
      JINJA_RETURN_IF_ERROR(Exec(s.body, scope));
      const Flow flow = flow_;
      flow_ = Flow::kNormal;
      if (flow == Flow::kBreak) break;
    }
    return absl::OkStatus();
  }

  absl::Status Assign(const Target& target, Value value, const FramePtr& frame) {
    if (!target.attribute.empty()) {
      const Value* ns = frame->Find(target.names[0]);
      if (ns == nullptr || ns->kind() != Kind::kNamespace) {
        return absl::FailedPreconditionError("cannot assign attribute on non-namespace object");
      }
      if (target.attribute[0] == '_') {
        return absl::FailedPreconditionError(absl::StrCat(
            "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '", target.attribute,
            "'. Please rename the attribute."));
      }
      return ns->ns().attrs().Set(Value::Markup(target.attribute), std::move(value));
    }
    if (!target.is_tuple) {
      frame->Set(target.names[0], std::move(value));
      return absl::OkStatus();
    }
    JINJA_ASSIGN_OR_RETURN(std::vector<Value> parts, Iterate(value));
    if (parts.size() < target.names.size()) {
      return absl::FailedPreconditionError(absl::StrCat("not enough values to unpack (expected ",
                                                        target.names.size(), ", got ", parts.size(), ")"));
    }
    if (parts.size() > target.names.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("too many values to unpack (expected ", target.names.size(), ")"));
    }
    for (size_t i = 0; i < parts.size(); ++i) frame->Set(target.names[i], std::move(parts[i]));
    return absl::OkStatus();
  }

  // A filter chain whose innermost operand is null (filter blocks, block sets) applied to `input`.
  absl::StatusOr<Value> ApplyFilterChain(const Expr& chain, Value input, const FramePtr& frame) {
    const Value saved = std::move(filter_input_);
    filter_input_ = std::move(input);
    absl::StatusOr<Value> r = Eval(chain, frame);
    filter_input_ = saved;
    return r;
  }

  // Operations on a value cost time in proportion to its size (a substring search, a comparison, a copy), so each
  // operand is charged by size as well as the node that uses it.
  absl::Status ChargeOperand(const Value& v) {
    switch (v.kind()) {
      case Kind::kString:
        return budget_.ChargeString(v.string().size());
      case Kind::kList:
      case Kind::kTuple:
      case Kind::kRange:
      case Kind::kIterator:
        return budget_.ChargeItems(v.items().size());
      case Kind::kDict:
      case Kind::kDictItems:
      case Kind::kDictKeys:
      case Kind::kDictValues:
        return budget_.ChargeItems(v.dict().size());
      default:
        return absl::OkStatus();
    }
  }

  absl::Status ChargeArgs(const CallArgs& args) {
    for (const Value& v : args.positional) JINJA_RETURN_IF_ERROR(ChargeOperand(v));
    for (const auto& [name, v] : args.keywords) JINJA_RETURN_IF_ERROR(ChargeOperand(v));
    return absl::OkStatus();
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, const FramePtr& frame) {
    CallArgs args;
    for (const ExprPtr& item : e.items) {
      JINJA_ASSIGN_OR_RETURN(Value v, Eval(*item, frame));
      args.positional.push_back(std::move(v));
    }
    for (const Keyword& k : e.keywords) {
      JINJA_ASSIGN_OR_RETURN(Value v, Eval(*k.value, frame));
      args.keywords.emplace_back(k.name, std::move(v));
    }
    JINJA_RETURN_IF_ERROR(ChargeArgs(args));
    return args;
  }

  absl::StatusOr<Value> EvalCall(const Expr& e, const FramePtr& frame, const Value* caller) {
    JINJA_ASSIGN_OR_RETURN(Value callee, Eval(*e.object, frame));
    JINJA_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
    if (caller != nullptr) args.keywords.emplace_back("caller", *caller);
    if (callee.is_undefined()) return UndefinedError(callee);
    if (callee.kind() != Kind::kCallable) {
      return absl::FailedPreconditionError(absl::StrCat("'", TypeName(callee), "' object is not callable"));
    }
    return callee.callable().Call(env_, std::move(args));
  }

  absl::StatusOr<Value> Eval(const Expr& e, const FramePtr& frame) {
    DepthGuard guard(this);
    absl::Status status = guard.Check();
    if (status.ok()) status = budget_.Step();
    if (!status.ok()) return Locate(status, e.line);
    absl::StatusOr<Value> r = EvalImpl(e, frame);
    if (!r.ok()) return Locate(r.status(), e.line);
    return r;
  }

  absl::StatusOr<Value> EvalImpl(const Expr& e, const FramePtr& frame) {
    switch (e.kind) {
      case ExprKind::kLiteral:
        return e.value;
      case ExprKind::kName: {
        if (const Value* v = frame->Find(e.name)) return *v;
        auto it = globals_.find(e.name);
        if (it != globals_.end()) return it->second;
        return Value::Undefined(absl::StrCat("'", e.name, "' is undefined"));
      }
      case ExprKind::kList:
      case ExprKind::kTuple: {
        std::vector<Value> items;
        for (const ExprPtr& item : e.items) {
          JINJA_ASSIGN_OR_RETURN(Value v, Eval(*item, frame));
          items.push_back(std::move(v));
        }
        return e.kind == ExprKind::kList ? Value::List(std::move(items)) : Value::Tuple(std::move(items));
      }
      case ExprKind::kDict: {
        Dict dict;
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          JINJA_ASSIGN_OR_RETURN(Value key, Eval(*e.items[i], frame));
          JINJA_ASSIGN_OR_RETURN(Value value, Eval(*e.items[i + 1], frame));
          JINJA_RETURN_IF_ERROR(dict.Set(std::move(key), std::move(value)));
        }
        return Value::DictOf(std::move(dict));
      }
      case ExprKind::kGetAttr: {
        JINJA_ASSIGN_OR_RETURN(Value obj, Eval(*e.object, frame));
        JINJA_RETURN_IF_ERROR(ChargeOperand(obj));
        return GetAttr(obj, e.name);
      }
      case ExprKind::kGetItem: {
        JINJA_ASSIGN_OR_RETURN(Value obj, Eval(*e.object, frame));
        JINJA_RETURN_IF_ERROR(ChargeOperand(obj));
        if (e.index->kind == ExprKind::kSlice) {
          const Expr& sl = *e.index;
          Value bounds[3] = {Value::None(), Value::None(), Value::None()};
          const Expr* parts[3] = {sl.start.get(), sl.stop.get(), sl.step.get()};
          for (int i = 0; i < 3; ++i) {
            if (parts[i] != nullptr) {
              JINJA_ASSIGN_OR_RETURN(bounds[i], Eval(*parts[i], frame));
            }
          }
          return GetSlice(obj, bounds[0], bounds[1], bounds[2], budget_);
        }
        JINJA_ASSIGN_OR_RETURN(Value key, Eval(*e.index, frame));
        return GetItem(obj, key);
      }
      case ExprKind::kSlice:
        return absl::FailedPreconditionError("a slice outside of a subscript");
      case ExprKind::kCall:
        return EvalCall(e, frame, nullptr);
      case ExprKind::kFilter: {
        Value operand = filter_input_;
        if (e.object) {
          JINJA_ASSIGN_OR_RETURN(operand, Eval(*e.object, frame));
        }
        JINJA_RETURN_IF_ERROR(ChargeOperand(operand));
        JINJA_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
        return e.filter(env_, operand, args);
      }
      case ExprKind::kTest: {
        JINJA_ASSIGN_OR_RETURN(Value operand, Eval(*e.object, frame));
        JINJA_RETURN_IF_ERROR(ChargeOperand(operand));
        JINJA_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, frame));
        JINJA_ASSIGN_OR_RETURN(bool r, e.is_test(env_, operand, args));
        return Value::Bool(r);
      }
      case ExprKind::kNot: {
        JINJA_ASSIGN_OR_RETURN(Value v, Eval(*e.object, frame));
        return Value::Bool(!Truthy(v));
      }
      case ExprKind::kNegate: {
        JINJA_ASSIGN_OR_RETURN(Value v, Eval(*e.object, frame));
        return Negate(v);
      }
      case ExprKind::kPlus: {
        JINJA_ASSIGN_OR_RETURN(Value v, Eval(*e.object, frame));
        return Positive(v);
      }
      case ExprKind::kBinary: {
        JINJA_ASSIGN_OR_RETURN(Value a, Eval(*e.left, frame));
        JINJA_ASSIGN_OR_RETURN(Value b, Eval(*e.right, frame));
        JINJA_RETURN_IF_ERROR(ChargeOperand(a));
        JINJA_RETURN_IF_ERROR(ChargeOperand(b));
        return Arithmetic(e.name, a, b, budget_);
      }
      case ExprKind::kConcat: {
        std::vector<Value> parts;
        for (const ExprPtr& item : e.items) {
          JINJA_ASSIGN_OR_RETURN(Value v, Eval(*item, frame));
          parts.push_back(std::move(v));
        }
        return Concat(parts, budget_);
      }
      case ExprKind::kCompare: {
        JINJA_ASSIGN_OR_RETURN(Value left, Eval(*e.object, frame));
        JINJA_RETURN_IF_ERROR(ChargeOperand(left));
        for (const auto& [op, operand] : e.comparisons) {
          JINJA_ASSIGN_OR_RETURN(Value right, Eval(*operand, frame));
          JINJA_RETURN_IF_ERROR(ChargeOperand(right));
          JINJA_ASSIGN_OR_RETURN(bool r, Compare(op, left, right));
          if (!r) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case ExprKind::kAnd: {
        JINJA_ASSIGN_OR_RETURN(Value left, Eval(*e.left, frame));
        if (!Truthy(left)) return left;
        return Eval(*e.right, frame);
      }
      case ExprKind::kOr: {
        JINJA_ASSIGN_OR_RETURN(Value left, Eval(*e.left, frame));
        if (Truthy(left)) return left;
        return Eval(*e.right, frame);
      }
      case ExprKind::kCondition: {
        JINJA_ASSIGN_OR_RETURN(Value test, Eval(*e.test, frame));
        if (Truthy(test)) return Eval(*e.then, frame);
        if (e.otherwise) return Eval(*e.otherwise, frame);
        return Value::Undefined(absl::StrCat("the inline if-expression on line ", e.line,
                                             " evaluated to false and no else section was defined."));
      }
    }
    return absl::InternalError("unknown expression");
  }

  Budget budget_;
  Env env_;
  absl::flat_hash_map<std::string, Value> globals_;
  std::vector<TaintedString> out_;
  Flow flow_ = Flow::kNormal;
  int depth_ = 0;
  int call_depth_ = 0;
  Value filter_input_;
  std::vector<std::shared_ptr<Namespace>> namespaces_;
  std::vector<std::shared_ptr<LoopContext>> loops_;
  std::vector<FramePtr> closures_;
};

absl::StatusOr<Value> MacroFunction::Call(Env&, CallArgs args) const {
  return interp_->CallMacro(*this, std::move(args));
}

absl::StatusOr<Value> Interpreter::CallMacro(const MacroFunction& macro, CallArgs args) {
  if (call_depth_ >= Limits::kMaxCallDepth) {
    return absl::FailedPreconditionError(
        absl::StrCat("macro calls nested deeper than ", Limits::kMaxCallDepth, " levels"));
  }
  const Stmt& def = macro.def();
  auto scope = std::make_shared<Frame>(macro.closure());
  const size_t n = def.params.size();
  std::vector<std::optional<Value>> bound(n);
  for (size_t i = 0; i < args.positional.size() && i < n; ++i) bound[i] = std::move(args.positional[i]);
  if (args.positional.size() > n && !def.uses_varargs) {
    return absl::FailedPreconditionError(
        absl::StrCat("macro '", macro.name(), "' takes not more than ", n, " argument(s)"));
  }
  std::vector<Value> varargs;
  for (size_t i = n; i < args.positional.size(); ++i) varargs.push_back(std::move(args.positional[i]));
  Dict kwargs;
  std::optional<Value> caller;
  for (auto& [name, value] : args.keywords) {
    size_t i = 0;
    while (i < n && def.params[i].name != name) ++i;
    if (i < n) {
      if (bound[i]) {
        return absl::FailedPreconditionError(
            absl::StrCat("macro '", macro.name(), "' got multiple values for argument '", name, "'"));
      }
      bound[i] = std::move(value);
    } else if (name == "caller" && def.uses_caller) {
      caller = std::move(value);
    } else if (def.uses_kwargs) {
      JINJA_RETURN_IF_ERROR(kwargs.Set(Value::Markup(name), std::move(value)));
    } else {
      return absl::FailedPreconditionError(
          absl::StrCat("macro '", macro.name(), "' takes no keyword argument '", name, "'"));
    }
  }
  // Defaults are evaluated in the macro's scope, after the arguments before them are bound.
  for (size_t i = 0; i < n; ++i) {
    const Param& p = def.params[i];
    if (!bound[i]) {
      if (p.default_value) {
        JINJA_ASSIGN_OR_RETURN(bound[i], Eval(*p.default_value, scope));
      } else {
        bound[i] = Value::Undefined(absl::StrCat("parameter '", p.name, "' was not provided"));
      }
    }
    scope->Set(p.name, *std::move(bound[i]));
  }
  if (def.uses_varargs) {
    JINJA_ASSIGN_OR_RETURN(Value v, Value::Tuple(std::move(varargs)));
    scope->Set("varargs", std::move(v));
  }
  if (def.uses_kwargs) {
    JINJA_ASSIGN_OR_RETURN(Value v, Value::DictOf(std::move(kwargs)));
    scope->Set("kwargs", std::move(v));
  }
  if (def.uses_caller) scope->Set("caller", caller ? *caller : Value::Undefined("No caller defined"));
  ++call_depth_;
  absl::StatusOr<TaintedString> body = Capture(def.body, scope);
  --call_depth_;
  flow_ = Flow::kNormal;
  if (!body.ok()) return body.status();
  return Value::String(*std::move(body));
}

absl::StatusOr<Value> GlobalFunction::Call(Env& env, CallArgs args) const {
  switch (which_) {
    case Global::kRaiseException: {
      JINJA_ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("raise_exception", args, {"message"}, 1));
      JINJA_ASSIGN_OR_RETURN(TaintedString message, ToStr(*a.Get(0)));
      return MarkLocated(absl::InvalidArgumentError(message.bytes()));
    }
    case Global::kStrftimeNow: {
      JINJA_ASSIGN_OR_RETURN(BoundArgs a, BoundArgs::Bind("strftime_now", args, {"format"}, 1));
      JINJA_ASSIGN_OR_RETURN(std::string format, a.String(0, ""));
      JINJA_ASSIGN_OR_RETURN(std::string text, Strftime(format, env.now));
      return Value::Markup(std::move(text));
    }
    case Global::kNamespace:
    case Global::kDict: {
      Dict attrs;
      if (args.positional.size() > 1) {
        return TypeError(absl::StrCat(name_, "() expected at most 1 positional argument, got ",
                                      args.positional.size()));
      }
      if (args.positional.size() == 1) {
        const Value& init = args.positional[0];
        if (init.kind() == Kind::kDict) {
          attrs = init.dict();
        } else {
          JINJA_ASSIGN_OR_RETURN(std::vector<Value> pairs, Iterate(init));
          for (const Value& pair : pairs) {
            JINJA_ASSIGN_OR_RETURN(std::vector<Value> kv, Iterate(pair));
            if (kv.size() != 2) {
              return TypeError("dictionary update sequence element has the wrong length; 2 is required");
            }
            JINJA_RETURN_IF_ERROR(attrs.Set(kv[0], kv[1]));
          }
        }
      }
      for (auto& [name, value] : args.keywords) JINJA_RETURN_IF_ERROR(attrs.Set(Value::Markup(name), value));
      JINJA_RETURN_IF_ERROR(env.budget->ChargeItems(attrs.size()));
      if (which_ == Global::kDict) return Value::DictOf(std::move(attrs));
      for (const auto& [key, value] : attrs.entries()) {
        if (key.is_string() && !key.string().empty() && key.string().bytes()[0] == '_') {
          return absl::FailedPreconditionError(absl::StrCat(
              "Chat templates cannot store underscore-prefixed attributes on a namespace, but got ",
              StringRepr(key.string().bytes()), ". Please rename the attribute."));
        }
      }
      return interp_->NewNamespace(std::move(attrs));
    }
    case Global::kRange: {
      if (!args.keywords.empty()) return TypeError("range() takes no keyword arguments");
      if (args.positional.empty() || args.positional.size() > 3) {
        return TypeError(absl::StrCat("range expected 1 to 3 arguments, got ", args.positional.size()));
      }
      int64_t v[3] = {0, 0, 1};
      for (size_t i = 0; i < args.positional.size(); ++i) {
        const Value& x = args.positional[i];
        if (!x.is_integral()) {
          return TypeError(absl::StrCat("'", TypeName(x), "' object cannot be interpreted as an integer"));
        }
        v[i] = x.int_value();
      }
      int64_t start = 0, stop = v[0], step = 1;
      if (args.positional.size() >= 2) {
        start = v[0];
        stop = v[1];
      }
      if (args.positional.size() == 3) step = v[2];
      if (step == 0) return TypeError("range() arg 3 must not be zero");
      const __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
      const __int128 magnitude = step > 0 ? step : -static_cast<__int128>(step);
      const __int128 count = span > 0 ? (span + magnitude - 1) / magnitude : 0;
      constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE
      if (count > kMaxRange) {
        return absl::FailedPreconditionError(absl::StrCat(
            "Range too big. The sandbox blocks ranges larger than MAX_RANGE (", kMaxRange, ")."));
      }
      JINJA_RETURN_IF_ERROR(env.budget->ChargeItems(static_cast<size_t>(count)));
      std::vector<Value> items;
      items.reserve(static_cast<size_t>(count));
      for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) items.push_back(Value::Int(start + i * step));
      return Value::Range(start, stop, step, std::move(items));
    }
  }
  return absl::InternalError("unknown global");
}

// C strftime (glibc, C locale) on a naive datetime, as Python's datetime.strftime produces it.
absl::StatusOr<std::string> Strftime(std::string_view format, absl::Time now) {
  static constexpr const char* kDays[] = {"Monday", "Tuesday", "Wednesday", "Thursday",
                                          "Friday", "Saturday", "Sunday"};
  static constexpr const char* kMonths[] = {"January", "February", "March",     "April",   "May",      "June",
                                            "July",    "August",   "September", "October", "November", "December"};
  const absl::CivilSecond t = absl::ToCivilSecond(now, absl::UTCTimeZone());
  const int weekday = static_cast<int>(absl::GetWeekday(absl::CivilDay(t)));  // Monday == 0
  const int yday = absl::GetYearDay(absl::CivilDay(t));
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (++i >= format.size()) return absl::FailedPreconditionError("strftime format ends with '%'");
    char pad = '0';
    if (format[i] == '-' || format[i] == '_') {
      pad = format[i] == '-' ? 0 : ' ';
      if (++i >= format.size()) return absl::FailedPreconditionError("strftime format ends with a flag");
    }
    auto number = [&](int64_t value, int width) {
      std::string digits = absl::StrCat(value);
      if (pad != 0 && static_cast<int>(digits.size()) < width) {
        digits.insert(0, static_cast<size_t>(width) - digits.size(), pad);
      }
      out += digits;
    };
    const int hour12 = t.hour() % 12 == 0 ? 12 : t.hour() % 12;
    switch (format[i]) {
      case '%':
        out.push_back('%');
        break;
      case 'a':
        out.append(kDays[weekday], 3);
        break;
      case 'A':
        out += kDays[weekday];
        break;
      case 'b':
      case 'h':
        out.append(kMonths[t.month() - 1], 3);
        break;
      case 'B':
        out += kMonths[t.month() - 1];
        break;
      case 'd':
        number(t.day(), 2);
        break;
      case 'e':
        if (pad == '0') pad = ' ';
        number(t.day(), 2);
        break;
      case 'H':
        number(t.hour(), 2);
        break;
      case 'I':
        number(hour12, 2);
        break;
      case 'j':
        number(yday, 3);
        break;
      case 'm':
        number(t.month(), 2);
        break;
      case 'M':
        number(t.minute(), 2);
        break;
      case 'S':
        number(t.second(), 2);
        break;
      case 'p':
        out += t.hour() < 12 ? "AM" : "PM";
        break;
      case 'y':
        number(t.year() % 100, 2);
        break;
      case 'Y':
        out += absl::StrCat(t.year());
        break;
      case 'u':
        out += absl::StrCat(weekday + 1);
        break;
      case 'w':
        out += absl::StrCat((weekday + 1) % 7);
        break;
      case 'z':
      case 'Z':
        break;  // a naive datetime has no zone
      default:
        return absl::FailedPreconditionError(
            absl::StrCat("strftime directive %", std::string(1, format[i]), " is not supported"));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<TaintedString> RenderTemplate(const Template& tpl,
                                             const std::vector<std::pair<std::string, Value>>& context,
                                             absl::Time now) {
  Interpreter interpreter(now);
  absl::StatusOr<TaintedString> out = interpreter.Render(tpl, context);
  if (!out.ok()) {
    absl::Status s(out.status().code(), out.status().message());  // without the internal payload
    return s;
  }
  return out;
}

}  // namespace decoded::jinja
