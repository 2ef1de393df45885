#include "engine/chat/jinja_args.h"

#include "absl/strings/str_cat.h"
#include "engine/chat/jinja_status.h"

namespace decoded::jinja {

absl::Status TypeError(absl::string_view message) { return absl::FailedPreconditionError(message); }

absl::StatusOr<BoundArgs> BoundArgs::Bind(std::string_view callee, const CallArgs& args,
                                          std::initializer_list<std::string_view> params, size_t required) {
  BoundArgs bound;
  bound.callee_ = std::string(callee);
  const absl::string_view name_of_callee = Sv(callee);
  for (std::string_view p : params) bound.names_.emplace_back(p);
  bound.values_.resize(params.size());
  bound.given_.assign(params.size(), false);
  if (args.positional.size() > params.size()) {
    return TypeError(absl::StrCat(name_of_callee, "() takes at most ", params.size(), " argument(s) (",
                                  args.positional.size(), " given)"));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) {
    bound.values_[i] = args.positional[i];
    bound.given_[i] = true;
  }
  for (const auto& [name, value] : args.keywords) {
    size_t i = 0;
    while (i < bound.names_.size() && bound.names_[i] != name) ++i;
    if (i == bound.names_.size()) {
      return TypeError(absl::StrCat(name_of_callee, "() got an unexpected keyword argument '", name, "'"));
    }
    if (bound.given_[i]) {
      return TypeError(absl::StrCat(name_of_callee, "() got multiple values for argument '", name, "'"));
    }
    bound.values_[i] = value;
    bound.given_[i] = true;
  }
  for (size_t i = 0; i < required; ++i) {
    if (!bound.given_[i]) {
      return TypeError(absl::StrCat(name_of_callee, "() missing required argument '", bound.names_[i], "'"));
    }
  }
  return bound;
}

absl::StatusOr<int64_t> BoundArgs::Int(size_t i, int64_t fallback) const {
  if (!given_[i]) return fallback;
  const Value& v = values_[i];
  if (!v.is_integral()) {
    return TypeError(absl::StrCat(callee_, "(): argument '", names_[i], "' must be an integer, not ", TypeName(v)));
  }
  return v.int_value();
}

absl::StatusOr<bool> BoundArgs::Bool(size_t i, bool fallback) const {
  if (!given_[i]) return fallback;
  return Truthy(values_[i]);
}

absl::StatusOr<std::optional<std::string>> BoundArgs::StringOrNone(size_t i) const {
  if (!given_[i] || values_[i].is_none()) return std::optional<std::string>();
  const Value& v = values_[i];
  if (!v.is_string()) {
    return TypeError(absl::StrCat(callee_, "(): argument '", names_[i], "' must be a string, not ", TypeName(v)));
  }
  return std::optional<std::string>(v.string().bytes());
}

absl::StatusOr<std::string> BoundArgs::String(size_t i, std::string_view fallback) const {
  if (!given_[i]) return std::string(fallback);
  const Value& v = values_[i];
  if (!v.is_string()) {
    return TypeError(absl::StrCat(callee_, "(): argument '", names_[i], "' must be a string, not ", TypeName(v)));
  }
  return v.string().bytes();
}

}  // namespace decoded::jinja
