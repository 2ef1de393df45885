// The first command-line flag no program flag is defined for, and the first
// flag value its type cannot hold, so that a program can refuse them with its
// own exit status (Abseil's parser exits 1, where decoded and decoded-cli say
// 2 for bad input).
//
// Header-only: decoded and decoded-cli both use it.
#ifndef DECODED_SERVER_UNKNOWN_FLAGS_H_
#define DECODED_SERVER_UNKNOWN_FLAGS_H_

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_split.h"

namespace decoded {

// Abseil's usage flags: its parser handles them itself and they are not in
// its flag registry (absl/flags/internal/usage.cc, DeduceUsageFlags).
inline bool IsAbslUsageFlag(std::string_view name) {
  for (std::string_view usage : {"help", "helpfull", "helpshort", "helppackage", "helpon", "helpmatch", "version",
                                 "only_check_args"}) {
    if (name == usage) return true;
  }
  return false;
}

// "--name", "--name=value", "-name", and "--noname" for a bool flag; stops at
// "--" (what follows is positional). Abseil's usage flags and the names an
// --undefok lists (Abseil's meaning: may be given though not defined) are
// not unknown. Returns the first unknown name.
inline std::optional<std::string> FirstUnknownFlag(int argc, char** argv) {
  std::vector<std::string> undefok;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") break;
    for (std::string_view prefix : {"--undefok=", "-undefok="}) {
      if (arg.substr(0, prefix.size()) == prefix) {
        const std::string names(arg.substr(prefix.size()));
        for (absl::string_view name : absl::StrSplit(names, ',')) undefok.emplace_back(name);
      }
    }
  }
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const std::string name(arg.substr(0, arg.find('=')));
    if (const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name)) {
      // "--name value": the value is not a flag, even when it starts with '-'
      // ("--presence_penalty -0.5").
      if (arg.find('=') == std::string_view::npos && !flag->IsOfType<bool>()) ++i;
      continue;
    }
    if (IsAbslUsageFlag(name)) continue;
    if (std::find(undefok.begin(), undefok.end(), name) != undefok.end()) continue;
    if (name.rfind("no", 0) == 0) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name.substr(2));
      if (flag != nullptr && flag->IsOfType<bool>()) continue;
    }
    return name;
  }
  return std::nullopt;
}

// "--name=value", or "--name value" for a flag that is not a bool, whose
// value the flag's type cannot hold ("--port=x", an int64 past 2^63):
// "--name: <Abseil's reason>". Run after FirstUnknownFlag. Values are parsed
// into the flags as ParseCommandLine would (it parses them again). Abseil's
// flags that read more flags (--flagfile, --fromenv, --tryfromenv) and
// --undefok are left to it: setting them early would make it apply them
// twice.
inline std::optional<std::string> FirstBadFlagValue(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const size_t eq = arg.find('=');
    const std::string name(arg.substr(0, eq));
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;  // a usage flag, --noname, or one --undefok names
    const bool abseils_own = name == "flagfile" || name == "fromenv" || name == "tryfromenv" || name == "undefok";
    std::string value;
    if (eq != std::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return "--" + name + ": missing a value";
    }
    if (abseils_own || flag->IsRetired()) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error)) return "--" + name + ": " + error;
  }
  return std::nullopt;
}

}  // namespace decoded

#endif  // DECODED_SERVER_UNKNOWN_FLAGS_H_
