#include "engine/chat/jinja_parser.h"

#include <initializer_list>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/chat/jinja_lexer.h"
#include "engine/chat/jinja_methods.h"
#include "engine/chat/jinja_status.h"

namespace decoded::jinja {
namespace {

constexpr int kMaxNesting = 128;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<std::unique_ptr<const Template>> Run() {
    auto tpl = std::make_unique<Template>();
    JINJA_ASSIGN_OR_RETURN(tpl->body, Subparse({}));
    if (Current().type != TokenType::kEof) return Fail(Current(), "unexpected token");
    return std::unique_ptr<const Template>(std::move(tpl));
  }

 private:
  // ---- tokens ----

  const Token& Current() const { return tokens_[pos_]; }
  const Token& Look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  const Token& Advance() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool IsName(std::string_view name) const { return IsName(Current(), name); }
  static bool IsName(const Token& t, std::string_view name) { return t.type == TokenType::kName && t.text == name; }
  bool IsOp(std::string_view op) const { return Current().type == TokenType::kOperator && Current().text == op; }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Advance();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Advance();
    return true;
  }

  static std::string Describe(const Token& t) {
    switch (t.type) {
      case TokenType::kData:
        return "template data / text";
      case TokenType::kVariableBegin:
        return "begin of print statement";
      case TokenType::kVariableEnd:
        return "end of print statement";
      case TokenType::kBlockBegin:
        return "begin of statement block";
      case TokenType::kBlockEnd:
        return "end of statement block";
      case TokenType::kName:
      case TokenType::kOperator:
        return t.text;
      case TokenType::kString:
        return "string";
      case TokenType::kInteger:
        return "integer";
      case TokenType::kFloat:
        return "float";
      case TokenType::kEof:
        return "end of template";
    }
    return "token";
  }

  static absl::Status Fail(const Token& t, absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(PositionPrefix(t.line, t.column), message));
  }
  static absl::Status Unsupported(const Token& t, absl::string_view what) {
    return absl::UnimplementedError(absl::StrCat(PositionPrefix(t.line, t.column), what, " is not supported"));
  }

  absl::Status Expect(TokenType type, std::string_view what) {
    if (Current().type != type) {
      return Fail(Current(), absl::StrCat("expected token '", Sv(what), "', got '", Describe(Current()), "'"));
    }
    Advance();
    return absl::OkStatus();
  }
  absl::Status ExpectOp(std::string_view op) {
    if (!IsOp(op)) {
      return Fail(Current(), absl::StrCat("expected token '", Sv(op), "', got '", Describe(Current()), "'"));
    }
    Advance();
    return absl::OkStatus();
  }
  absl::Status ExpectName(std::string_view name) {
    if (!IsName(name)) {
      return Fail(Current(), absl::StrCat("expected token '", Sv(name), "', got '", Describe(Current()), "'"));
    }
    Advance();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectAnyName() {
    if (Current().type != TokenType::kName) {
      return Fail(Current(), absl::StrCat("expected token 'name', got '", Describe(Current()), "'"));
    }
    return Advance().text;
  }

  // Bounds recursion: Python's parser would hit its recursion limit on such input anyway.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser* p) : p_(p) { ++p_->depth_; }
    ~DepthGuard() { --p_->depth_; }
    absl::Status Check() const {
      if (p_->depth_ > kMaxNesting) {
        return Fail(p_->Current(), absl::StrCat("nesting deeper than ", kMaxNesting, " levels"));
      }
      return absl::OkStatus();
    }

   private:
    Parser* p_;
  };

  static ExprPtr NewExpr(ExprKind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }

  // ---- statements ----

  // Parses until a block tag whose name is one of `end_tokens` (left as the current token), or the end.
  absl::StatusOr<Body> Subparse(std::initializer_list<std::string_view> end_tokens) {
    DepthGuard guard(this);
    JINJA_RETURN_IF_ERROR(guard.Check());
    Body body;
    while (Current().type != TokenType::kEof) {
      const Token& t = Current();
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        Advance();
      } else if (t.type == TokenType::kVariableBegin) {
        Advance();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kPrint;
        s->line = t.line;
        JINJA_ASSIGN_OR_RETURN(s->expr, ParseTuple(/*with_condexpr=*/true, {}));
        JINJA_RETURN_IF_ERROR(Expect(TokenType::kVariableEnd, "end of print statement"));
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        Advance();
        for (std::string_view end : end_tokens) {
          if (IsName(end)) return body;
        }
        JINJA_RETURN_IF_ERROR(ParseStatement(&body));
        JINJA_RETURN_IF_ERROR(Expect(TokenType::kBlockEnd, "end of statement block"));
      } else {
        return Fail(t, absl::StrCat("unexpected '", Describe(t), "'"));
      }
    }
    if (end_tokens.size() > 0) {
      std::vector<std::string> names;
      for (std::string_view e : end_tokens) names.push_back(absl::StrCat("'", Sv(e), "'"));
      return Fail(Current(), absl::StrCat("Unexpected end of template. Jinja was looking for the following tags: ",
                                          absl::StrJoin(names, " or "), "."));
    }
    return body;
  }

  // The body of a statement: `%}`, statements, then one of `end_tokens` (consumed when `drop_end`).
  absl::StatusOr<Body> ParseStatements(std::initializer_list<std::string_view> end_tokens, bool drop_end) {
    SkipOp(":");
    JINJA_RETURN_IF_ERROR(Expect(TokenType::kBlockEnd, "end of statement block"));
    JINJA_ASSIGN_OR_RETURN(Body body, Subparse(end_tokens));
    if (drop_end) Advance();
    return body;
  }

  absl::Status ParseStatement(Body* out) {
    const Token& t = Current();
    if (t.type != TokenType::kName) return Fail(t, "tag name expected");
    const std::string name = t.text;
    static const auto* const unsupported = new absl::flat_hash_set<std::string_view>{
        "block", "extends", "include", "import", "from", "autoescape"};
    if (unsupported->contains(name)) return Unsupported(t, absl::StrCat("statement '", name, "'"));
    if (name == "for") return ParseFor(out);
    if (name == "if") return ParseIf(out);
    if (name == "set") return ParseSet(out);
    if (name == "macro") return ParseMacro(out);
    if (name == "call") return ParseCallBlock(out);
    if (name == "filter") return ParseFilterBlock(out);
    if (name == "with") return ParseWith(out);
    if (name == "print") return ParsePrint(out);
    if (name == "generation") return ParseGeneration(out);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return Fail(t, absl::StrCat("'", name, "' outside loop"));
      auto s = NewStmt(name == "break" ? StmtKind::kBreak : StmtKind::kContinue, t);
      Advance();
      out->push_back(std::move(s));
      return absl::OkStatus();
    }
    return Fail(t, absl::StrCat("Encountered unknown tag '", name, "'."));
  }

  static StmtPtr NewStmt(StmtKind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    return s;
  }

  // A name, a tuple of names, or (with_namespace) name.attribute.
  absl::StatusOr<Target> ParseAssignTarget(bool with_namespace, bool name_only,
                                           std::initializer_list<std::string_view> extra_end) {
    Target target;
    target.line = Current().line;
    auto one = [&]() -> absl::Status {
      const Token& t = Current();
      if (t.type != TokenType::kName) {
        if (t.type == TokenType::kOperator && t.text == "(") {
          return Unsupported(t, "a parenthesized assignment target");
        }
        return Fail(t, absl::StrCat("can't assign to '", Describe(t), "'"));
      }
      if (t.text == "true" || t.text == "false" || t.text == "none" || t.text == "True" || t.text == "False" ||
          t.text == "None") {
        return Fail(t, "can't assign to 'const'");
      }
      Advance();
      target.names.push_back(t.text);
      if (with_namespace && IsOp(".")) {
        Advance();
        JINJA_ASSIGN_OR_RETURN(target.attribute, ExpectAnyName());
      }
      return absl::OkStatus();
    };
    if (name_only) {
      JINJA_RETURN_IF_ERROR(one());
      return target;
    }
    while (true) {
      if (!target.names.empty()) JINJA_RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd(extra_end)) break;
      JINJA_RETURN_IF_ERROR(one());
      if (IsOp(",")) {
        target.is_tuple = true;
      } else {
        break;
      }
    }
    if (target.names.empty()) return Fail(Current(), "expected an assignment target");
    if (target.is_tuple && !target.attribute.empty()) return Unsupported(Current(), "a tuple of namespace targets");
    return target;
  }

  bool IsTupleEnd(std::initializer_list<std::string_view> extra_end) const {
    const Token& t = Current();
    if (t.type == TokenType::kVariableEnd || t.type == TokenType::kBlockEnd ||
        (t.type == TokenType::kOperator && t.text == ")")) {
      return true;
    }
    for (std::string_view e : extra_end) {
      if (IsName(e)) return true;
    }
    return false;
  }

  absl::Status ParseFor(Body* out) {
    auto s = NewStmt(StmtKind::kFor, Advance());
    JINJA_ASSIGN_OR_RETURN(s->target, ParseAssignTarget(false, false, {"in"}));
    if (!s->target.attribute.empty()) return Fail(Current(), "can't assign to a namespace attribute in a for loop");
    JINJA_RETURN_IF_ERROR(ExpectName("in"));
    JINJA_ASSIGN_OR_RETURN(s->expr, ParseTuple(/*with_condexpr=*/false, {"recursive"}));
    if (SkipName("if")) {
      JINJA_ASSIGN_OR_RETURN(s->condition, ParseExpression(true));
    }
    if (IsName("recursive")) return Unsupported(Current(), "a recursive for loop");
    ++loop_depth_;
    absl::StatusOr<Body> body = ParseStatements({"endfor", "else"}, false);
    --loop_depth_;
    if (!body.ok()) return body.status();
    s->body = *std::move(body);
    if (Advance().text == "else") {
      JINJA_ASSIGN_OR_RETURN(s->else_body, ParseStatements({"endfor"}, true));
    }
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status ParseIf(Body* out) {
    auto s = NewStmt(StmtKind::kIf, Advance());
    JINJA_ASSIGN_OR_RETURN(s->expr, ParseTuple(/*with_condexpr=*/false, {}));
    JINJA_ASSIGN_OR_RETURN(s->body, ParseStatements({"elif", "else", "endif"}, false));
    const Token& end = Advance();
    if (end.text == "elif") {
      // elif nests as an if in the else branch.
      Body nested;
      --pos_;  // re-read "elif" as an "if"
      JINJA_RETURN_IF_ERROR(ParseIf(&nested));
      s->else_body = std::move(nested);
      out->push_back(std::move(s));
      return absl::OkStatus();
    }
    if (end.text == "else") {
      JINJA_ASSIGN_OR_RETURN(s->else_body, ParseStatements({"endif"}, true));
    }
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status ParseSet(Body* out) {
    const Token& at = Advance();
    JINJA_ASSIGN_OR_RETURN(Target target, ParseAssignTarget(true, false, {}));
    if (SkipOp("=")) {
      auto s = NewStmt(StmtKind::kSet, at);
      s->target = std::move(target);
      JINJA_ASSIGN_OR_RETURN(s->expr, ParseTuple(/*with_condexpr=*/true, {}));
      out->push_back(std::move(s));
      return absl::OkStatus();
    }
    auto s = NewStmt(StmtKind::kSetBlock, at);
    s->target = std::move(target);
    if (IsOp("|")) {
      JINJA_ASSIGN_OR_RETURN(s->expr, ParseFilterChain(nullptr, /*start_inline=*/false));
    }
    JINJA_ASSIGN_OR_RETURN(s->body, ParseStatements({"endset"}, true));
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status ParseSignature(Stmt* s) {
    JINJA_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!s->params.empty()) JINJA_RETURN_IF_ERROR(ExpectOp(","));
      Param p;
      JINJA_ASSIGN_OR_RETURN(p.name, ExpectAnyName());
      if (SkipOp("=")) {
        JINJA_ASSIGN_OR_RETURN(p.default_value, ParseExpression(true));
      } else if (!s->params.empty() && s->params.back().default_value != nullptr) {
        return Fail(Current(), "non-default argument follows default argument");
      }
      s->params.push_back(std::move(p));
    }
    return ExpectOp(")");
  }

  absl::Status ParseMacro(Body* out) {
    auto s = NewStmt(StmtKind::kMacro, Advance());
    JINJA_ASSIGN_OR_RETURN(s->text, ExpectAnyName());
    JINJA_RETURN_IF_ERROR(ParseSignature(s.get()));
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    absl::StatusOr<Body> body = ParseStatements({"endmacro"}, true);
    loop_depth_ = saved_loops;
    if (!body.ok()) return body.status();
    s->body = *std::move(body);
    for (const StmtPtr& st : s->body) ScanSpecialNames(*st, s.get());
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status ParseCallBlock(Body* out) {
    auto s = NewStmt(StmtKind::kCallBlock, Advance());
    if (IsOp("(")) JINJA_RETURN_IF_ERROR(ParseSignature(s.get()));
    const Token& at = Current();
    JINJA_ASSIGN_OR_RETURN(s->expr, ParseExpression(true));
    if (s->expr->kind != ExprKind::kCall) return Fail(at, "expected call");
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    absl::StatusOr<Body> body = ParseStatements({"endcall"}, true);
    loop_depth_ = saved_loops;
    if (!body.ok()) return body.status();
    s->body = *std::move(body);
    for (const StmtPtr& st : s->body) ScanSpecialNames(*st, s.get());
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status ParseFilterBlock(Body* out) {
    auto s = NewStmt(StmtKind::kFilterBlock, Advance());
    JINJA_ASSIGN_OR_RETURN(s->expr, ParseFilterChain(nullptr, /*start_inline=*/true));
    JINJA_ASSIGN_OR_RETURN(s->body, ParseStatements({"endfilter"}, true));
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status ParseWith(Body* out) {
    auto s = NewStmt(StmtKind::kWith, Advance());
    while (Current().type != TokenType::kBlockEnd) {
      if (!s->with_assignments.empty()) JINJA_RETURN_IF_ERROR(ExpectOp(","));
      JINJA_ASSIGN_OR_RETURN(Target target, ParseAssignTarget(false, false, {}));
      JINJA_RETURN_IF_ERROR(ExpectOp("="));
      JINJA_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      s->with_assignments.emplace_back(std::move(target), std::move(value));
    }
    JINJA_ASSIGN_OR_RETURN(s->body, ParseStatements({"endwith"}, true));
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  absl::Status ParsePrint(Body* out) {
    const Token& at = Advance();
    bool first = true;
    while (Current().type != TokenType::kBlockEnd) {
      if (!first) JINJA_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      auto s = NewStmt(StmtKind::kPrint, at);
      JINJA_ASSIGN_OR_RETURN(s->expr, ParseExpression(true));
      out->push_back(std::move(s));
    }
    return absl::OkStatus();
  }

  // Hugging Face's AssistantTracker compiles the body as a call block, so it is a function body: its own scope,
  // and break/continue inside it do not reach an enclosing loop.
  absl::Status ParseGeneration(Body* out) {
    auto s = NewStmt(StmtKind::kGeneration, Advance());
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    absl::StatusOr<Body> body = ParseStatements({"endgeneration"}, true);
    loop_depth_ = saved_loops;
    if (!body.ok()) return body.status();
    s->body = *std::move(body);
    out->push_back(std::move(s));
    return absl::OkStatus();
  }

  // Records whether a macro or call block body reads varargs / kwargs / caller.
  static void ScanSpecialNames(const Expr& e, Stmt* macro) {
    if (e.kind == ExprKind::kName) {
      if (e.name == "varargs") macro->uses_varargs = true;
      if (e.name == "kwargs") macro->uses_kwargs = true;
      if (e.name == "caller") macro->uses_caller = true;
    }
    for (const Expr* child : {e.object.get(), e.index.get(), e.start.get(), e.stop.get(), e.step.get(),
                              e.left.get(), e.right.get(), e.test.get(), e.then.get(), e.otherwise.get()}) {
      if (child != nullptr) ScanSpecialNames(*child, macro);
    }
    for (const ExprPtr& item : e.items) ScanSpecialNames(*item, macro);
    for (const Keyword& k : e.keywords) ScanSpecialNames(*k.value, macro);
    for (const auto& [op, operand] : e.comparisons) ScanSpecialNames(*operand, macro);
  }

  static void ScanSpecialNames(const Stmt& s, Stmt* macro) {
    for (const Expr* e : {s.expr.get(), s.condition.get()}) {
      if (e != nullptr) ScanSpecialNames(*e, macro);
    }
    for (const Param& p : s.params) {
      if (p.default_value) ScanSpecialNames(*p.default_value, macro);
    }
    for (const auto& [target, value] : s.with_assignments) ScanSpecialNames(*value, macro);
    for (const StmtPtr& child : s.body) ScanSpecialNames(*child, macro);
    for (const StmtPtr& child : s.else_body) ScanSpecialNames(*child, macro);
  }

  // ---- expressions ----

  // Expressions separated by commas make a tuple (`{{ a, b }}`, `set x = 1, 2`).
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr, std::initializer_list<std::string_view> extra_end,
                                     bool explicit_parentheses = false) {
    const Token& at = Current();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) JINJA_RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd(extra_end)) break;
      JINJA_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(with_condexpr));
      items.push_back(std::move(item));
      if (IsOp(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) {
        return Fail(Current(), absl::StrCat("Expected an expression, got '", Describe(Current()), "'"));
      }
    }
    ExprPtr tuple = NewExpr(ExprKind::kTuple, at);
    tuple->items = std::move(items);
    return tuple;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    DepthGuard guard(this);
    JINJA_RETURN_IF_ERROR(guard.Check());
    if (with_condexpr) return ParseCondExpr();
    return ParseOr();
  }

  absl::StatusOr<ExprPtr> ParseCondExpr() {
    const Token& at = Current();
    JINJA_ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    while (SkipName("if")) {
      ExprPtr cond = NewExpr(ExprKind::kCondition, at);
      cond->then = std::move(expr);
      JINJA_ASSIGN_OR_RETURN(cond->test, ParseOr());
      if (SkipName("else")) {
        DepthGuard guard(this);
        JINJA_RETURN_IF_ERROR(guard.Check());
        JINJA_ASSIGN_OR_RETURN(cond->otherwise, ParseCondExpr());
      }
      expr = std::move(cond);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    JINJA_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      ExprPtr node = NewExpr(ExprKind::kOr, Advance());
      node->left = std::move(left);
      JINJA_ASSIGN_OR_RETURN(node->right, ParseAnd());
      left = std::move(node);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    JINJA_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      ExprPtr node = NewExpr(ExprKind::kAnd, Advance());
      node->left = std::move(left);
      JINJA_ASSIGN_OR_RETURN(node->right, ParseNot());
      left = std::move(node);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this);
      JINJA_RETURN_IF_ERROR(guard.Check());
      ExprPtr node = NewExpr(ExprKind::kNot, Advance());
      JINJA_ASSIGN_OR_RETURN(node->object, ParseNot());
      return node;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const Token& at = Current();
    JINJA_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    std::vector<std::pair<std::string, ExprPtr>> ops;
    while (true) {
      std::string op;
      const Token& t = Current();
      if (t.type == TokenType::kOperator &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = t.text;
        Advance();
      } else if (IsName("in")) {
        op = "in";
        Advance();
      } else if (IsName("not") && IsName(Look(), "in")) {
        op = "notin";
        Advance();
        Advance();
      } else {
        break;
      }
      JINJA_ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      ops.emplace_back(std::move(op), std::move(operand));
    }
    if (ops.empty()) return first;
    ExprPtr node = NewExpr(ExprKind::kCompare, at);
    node->object = std::move(first);
    node->comparisons = std::move(ops);
    return node;
  }

  absl::StatusOr<ExprPtr> Binary(ExprPtr left, const Token& op_token, ExprPtr right) {
    ExprPtr node = NewExpr(ExprKind::kBinary, op_token);
    node->name = op_token.text;
    node->left = std::move(left);
    node->right = std::move(right);
    return node;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    JINJA_ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const Token& op = Advance();
      JINJA_ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      JINJA_ASSIGN_OR_RETURN(left, Binary(std::move(left), op, std::move(right)));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    const Token& at = Current();
    JINJA_ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
    if (!IsOp("~")) return first;
    ExprPtr node = NewExpr(ExprKind::kConcat, at);
    node->items.push_back(std::move(first));
    while (SkipOp("~")) {
      JINJA_ASSIGN_OR_RETURN(ExprPtr next, ParseMath2());
      node->items.push_back(std::move(next));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    JINJA_ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const Token& op = Advance();
      JINJA_ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      JINJA_ASSIGN_OR_RETURN(left, Binary(std::move(left), op, std::move(right)));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    JINJA_ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp("**")) {
      const Token& op = Advance();
      JINJA_ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      JINJA_ASSIGN_OR_RETURN(left, Binary(std::move(left), op, std::move(right)));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    JINJA_RETURN_IF_ERROR(guard.Check());
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const Token& op = Advance();
      node = NewExpr(op.text == "-" ? ExprKind::kNegate : ExprKind::kPlus, op);
      JINJA_ASSIGN_OR_RETURN(node->object, ParseUnary(false));
    } else {
      JINJA_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    JINJA_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      JINJA_ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& t = Current();
    switch (t.type) {
      case TokenType::kName: {
        Advance();
        ExprPtr node = NewExpr(ExprKind::kLiteral, t);
        if (t.text == "true" || t.text == "True") {
          node->value = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          node->value = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          node->value = Value::None();
        } else {
          node->kind = ExprKind::kName;
          node->name = t.text;
        }
        return node;
      }
      case TokenType::kString: {
        ExprPtr node = NewExpr(ExprKind::kLiteral, t);
        std::string text;
        while (Current().type == TokenType::kString) text += Advance().text;
        node->value = Value::Markup(std::move(text));
        return node;
      }
      case TokenType::kInteger: {
        ExprPtr node = NewExpr(ExprKind::kLiteral, Advance());
        node->value = Value::Int(t.int_value);
        return node;
      }
      case TokenType::kFloat: {
        ExprPtr node = NewExpr(ExprKind::kLiteral, Advance());
        node->value = Value::Float(t.float_value);
        return node;
      }
      case TokenType::kOperator:
        if (t.text == "(") {
          Advance();
          JINJA_ASSIGN_OR_RETURN(ExprPtr node, ParseTuple(true, {}, /*explicit_parentheses=*/true));
          JINJA_RETURN_IF_ERROR(ExpectOp(")"));
          return node;
        }
        if (t.text == "[") return ParseList();
        if (t.text == "{") return ParseDict();
        break;
      default:
        break;
    }
    return Fail(t, absl::StrCat("unexpected '", Describe(t), "'"));
  }

  absl::StatusOr<ExprPtr> ParseList() {
    ExprPtr node = NewExpr(ExprKind::kList, Advance());
    while (!IsOp("]")) {
      if (!node->items.empty()) JINJA_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("]")) break;
      JINJA_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
      node->items.push_back(std::move(item));
    }
    JINJA_RETURN_IF_ERROR(ExpectOp("]"));
    return node;
  }

  absl::StatusOr<ExprPtr> ParseDict() {
    ExprPtr node = NewExpr(ExprKind::kDict, Advance());
    while (!IsOp("}")) {
      if (!node->items.empty()) JINJA_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("}")) break;
      JINJA_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
      JINJA_RETURN_IF_ERROR(ExpectOp(":"));
      JINJA_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      node->items.push_back(std::move(key));
      node->items.push_back(std::move(value));
    }
    JINJA_RETURN_IF_ERROR(ExpectOp("}"));
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        JINJA_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp("(")) {
        JINJA_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        JINJA_ASSIGN_OR_RETURN(node, ParseFilterChain(std::move(node), false));
      } else if (IsName("is")) {
        JINJA_ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp("(")) {
        JINJA_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const Token& t = Advance();
    if (t.text == ".") {
      const Token& attr = Current();
      if (attr.type == TokenType::kName) {
        Advance();
        ExprPtr e = NewExpr(ExprKind::kGetAttr, t);
        e->object = std::move(node);
        e->name = attr.text;
        return e;
      }
      if (attr.type != TokenType::kInteger) return Fail(attr, "expected name or number");
      Advance();
      ExprPtr e = NewExpr(ExprKind::kGetItem, t);
      e->object = std::move(node);
      e->index = NewExpr(ExprKind::kLiteral, attr);
      e->index->value = Value::Int(attr.int_value);
      return e;
    }
    // "[" subscript ("," subscript)* "]"
    std::vector<ExprPtr> args;
    while (!IsOp("]")) {
      if (!args.empty()) JINJA_RETURN_IF_ERROR(ExpectOp(","));
      JINJA_ASSIGN_OR_RETURN(ExprPtr arg, ParseSubscribed());
      args.push_back(std::move(arg));
    }
    JINJA_RETURN_IF_ERROR(ExpectOp("]"));
    ExprPtr e = NewExpr(ExprKind::kGetItem, t);
    e->object = std::move(node);
    if (args.size() == 1) {
      e->index = std::move(args[0]);
    } else {
      e->index = NewExpr(ExprKind::kTuple, t);
      e->index->items = std::move(args);
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseSubscribed() {
    const Token& at = Current();
    ExprPtr slice = NewExpr(ExprKind::kSlice, at);
    if (IsOp(":")) {
      Advance();
    } else {
      JINJA_ASSIGN_OR_RETURN(ExprPtr node, ParseExpression(true));
      if (!IsOp(":")) return node;
      Advance();
      slice->start = std::move(node);
    }
    if (!IsOp(":") && !IsOp("]") && !IsOp(",")) {
      JINJA_ASSIGN_OR_RETURN(slice->stop, ParseExpression(true));
    }
    if (SkipOp(":")) {
      if (!IsOp("]") && !IsOp(",")) {
        JINJA_ASSIGN_OR_RETURN(slice->step, ParseExpression(true));
      }
    }
    return slice;
  }

  // "(" args ")" into node->items / node->keywords.
  absl::Status ParseCallArgs(Expr* node) {
    const Token& open = Current();
    JINJA_RETURN_IF_ERROR(ExpectOp("("));
    bool require_comma = false;
    while (!IsOp(")")) {
      if (require_comma) {
        JINJA_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      if (IsOp("*") || IsOp("**")) return Unsupported(Current(), "a call with *args or **kwargs");
      if (Current().type == TokenType::kName && Look().type == TokenType::kOperator && Look().text == "=") {
        Keyword k;
        k.name = Advance().text;
        Advance();
        JINJA_ASSIGN_OR_RETURN(k.value, ParseExpression(true));
        node->keywords.push_back(std::move(k));
      } else {
        if (!node->keywords.empty()) return Fail(open, "invalid syntax for function call expression");
        JINJA_ASSIGN_OR_RETURN(ExprPtr arg, ParseExpression(true));
        node->items.push_back(std::move(arg));
      }
      require_comma = true;
    }
    return ExpectOp(")");
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    const Token& at = Current();
    ExprPtr node = NewExpr(ExprKind::kCall, at);
    if (callee->kind == ExprKind::kGetAttr && IsUnsupportedPythonMethod(callee->name)) {
      return Unsupported(at, absl::StrCat("method '", callee->name, "'"));
    }
    if (callee->kind == ExprKind::kName &&
        (callee->name == "cycler" || callee->name == "joiner" || callee->name == "lipsum")) {
      return Unsupported(at, absl::StrCat("global function '", callee->name, "'"));
    }
    node->object = std::move(callee);
    JINJA_RETURN_IF_ERROR(ParseCallArgs(node.get()));
    return node;
  }

  // Checks the literal filter or test name that map/select/reject/selectattr/rejectattr take.
  absl::Status CheckHigherOrderFilter(const Expr& filter, const Token& at) {
    size_t index;
    bool is_filter_name;
    if (filter.name == "map") {
      index = 0;
      is_filter_name = true;
    } else if (filter.name == "select" || filter.name == "reject") {
      index = 0;
      is_filter_name = false;
    } else if (filter.name == "selectattr" || filter.name == "rejectattr") {
      index = 1;
      is_filter_name = false;
    } else {
      return absl::OkStatus();
    }
    if (index >= filter.items.size()) return absl::OkStatus();
    const Expr& arg = *filter.items[index];
    if (arg.kind != ExprKind::kLiteral || !arg.value.is_string()) return absl::OkStatus();
    const std::string& name = arg.value.string().bytes();
    if (is_filter_name && FindFilter(name) == nullptr) return Unsupported(at, absl::StrCat("filter '", name, "'"));
    if (!is_filter_name && FindTest(name) == nullptr) return Unsupported(at, absl::StrCat("test '", name, "'"));
    return absl::OkStatus();
  }

  // One or more "| name(args)" applied to `operand` (null inside filter blocks and block sets).
  absl::StatusOr<ExprPtr> ParseFilterChain(ExprPtr operand, bool start_inline) {
    while (IsOp("|") || start_inline) {
      if (!start_inline) Advance();
      start_inline = false;
      const Token& name_token = Current();
      JINJA_ASSIGN_OR_RETURN(std::string name, ExpectAnyName());
      while (SkipOp(".")) {
        JINJA_ASSIGN_OR_RETURN(std::string part, ExpectAnyName());
        absl::StrAppend(&name, ".", part);
      }
      ExprPtr node = NewExpr(ExprKind::kFilter, name_token);
      node->name = name;
      node->filter = FindFilter(name);
      if (node->filter == nullptr) return Unsupported(name_token, absl::StrCat("filter '", name, "'"));
      node->object = std::move(operand);
      if (IsOp("(")) JINJA_RETURN_IF_ERROR(ParseCallArgs(node.get()));
      JINJA_RETURN_IF_ERROR(CheckHigherOrderFilter(*node, name_token));
      operand = std::move(node);
    }
    return operand;
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr operand) {
    const Token& is = Advance();
    const bool negated = SkipName("not");
    const Token& name_token = Current();
    JINJA_ASSIGN_OR_RETURN(std::string name, ExpectAnyName());
    while (SkipOp(".")) {
      JINJA_ASSIGN_OR_RETURN(std::string part, ExpectAnyName());
      absl::StrAppend(&name, ".", part);
    }
    ExprPtr node = NewExpr(ExprKind::kTest, name_token);
    node->name = name;
    node->is_test = FindTest(name);
    if (node->is_test == nullptr) return Unsupported(name_token, absl::StrCat("test '", name, "'"));
    node->object = std::move(operand);
    const Token& t = Current();
    if (IsOp("(")) {
      JINJA_RETURN_IF_ERROR(ParseCallArgs(node.get()));
    } else if ((t.type == TokenType::kName || t.type == TokenType::kString || t.type == TokenType::kInteger ||
                t.type == TokenType::kFloat || IsOp("[") || IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) return Fail(t, "You cannot chain multiple tests with is");
      JINJA_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      JINJA_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      node->items.push_back(std::move(arg));
    }
    if (!negated) return node;
    ExprPtr not_node = NewExpr(ExprKind::kNot, is);
    not_node->object = std::move(node);
    return not_node;
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<const Template>> ParseTemplate(std::string_view source) {
  JINJA_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  return Parser(std::move(tokens)).Run();
}

}  // namespace decoded::jinja
