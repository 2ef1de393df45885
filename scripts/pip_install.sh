#!/usr/bin/env bash
# pip_install.sh PYTHON PACKAGE...: installs PyPI packages for PYTHON. Debian 12's
# own interpreter refuses plain `pip install` (PEP 668, externally managed);
# the packages here are leaf tools of this project, so fall back to --user
# with --break-system-packages there rather than failing.
set -euo pipefail
py="$1"
shift
"$py" -m pip install --quiet "$@" >&2 && exit 0
"$py" -m pip install --quiet --user --break-system-packages "$@" >&2
