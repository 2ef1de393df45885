// The first command-line flag no program flag is defined for, so that a
// program can refuse it with its own exit status (Abseil's parser exits 1,
// where decoded and decoded-cli say 2 for bad input).
//
// Header-only: decoded and decoded-cli both use it.
#ifndef DECODED_SERVER_UNKNOWN_FLAGS_H_
#define DECODED_SERVER_UNKNOWN_FLAGS_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/flags/reflection.h"

namespace decoded {

// "--name", "--name=value", "-name", and "--noname" for a bool flag; stops at
// "--" (what follows is positional). Returns the first unknown name.
inline std::optional<std::string> FirstUnknownFlag(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const std::string name(arg.substr(0, arg.find('=')));
    if (absl::FindCommandLineFlag(name) != nullptr) continue;
    if (name.rfind("no", 0) == 0) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name.substr(2));
      if (flag != nullptr && flag->IsOfType<bool>()) continue;
    }
    return name;
  }
  return std::nullopt;
}

}  // namespace decoded

#endif  // DECODED_SERVER_UNKNOWN_FLAGS_H_
