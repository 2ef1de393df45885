#include "server/host_port.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace decoded::server {

absl::StatusOr<HostPort> SplitAddress(const std::string& address) {
  HostPort hp;
  size_t colon;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return absl::InvalidArgumentError(absl::StrCat("listen address \"", address, "\": expected [v6 address]:port"));
    }
    hp.host = address.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = address.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("listen address \"", address, "\": expected host:port"));
    }
    hp.host = address.substr(0, colon);
  }
  hp.port = address.substr(colon + 1);
  int port = 0;
  if (!absl::SimpleAtoi(hp.port, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("listen address \"", address, "\": bad port \"", hp.port, "\""));
  }
  return hp;
}

}  // namespace decoded::server
