#!/usr/bin/env bash
# Makes sure a headless Chromium is here, for the dashboard's browser test
# (integration/dashboard_test.go, run with CTXD_REQUIRE_CHROMIUM=1 by make
# test; playwright-core drives it). It is Debian's chromium package: as
# root this script installs it, otherwise it says what to run. $CHROMIUM
# names another Chromium instead.
# Usage: scripts/ensure-chromium.sh
set -euo pipefail

want="${CHROMIUM:-/usr/bin/chromium}"
if [ -x "$want" ]; then
	exit 0
fi
if [ -n "${CHROMIUM:-}" ]; then
	echo "CHROMIUM=$CHROMIUM is not an executable" >&2
	exit 1
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "Chromium is missing: install your distribution's chromium package" >&2
	echo "(Debian/Ubuntu: sudo apt-get install --no-install-recommends chromium)," >&2
	echo "set CHROMIUM to one you have, or run the tests without CTXD_REQUIRE_CHROMIUM=1 to skip the browser test" >&2
	exit 1
fi
echo "installing Chromium (Debian's chromium package)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
test -x /usr/bin/chromium
