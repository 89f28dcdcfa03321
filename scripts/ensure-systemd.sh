#!/usr/bin/env bash
# Makes sure systemd-analyze is here, for the test that has systemd check
# ctxd's units (systemd/systemd_test.go, run with CTXD_REQUIRE_SYSTEMD=1 by
# make test). On Debian it comes with the systemd package, which installs
# without running systemd (a container's init is left alone); as root this
# script installs it, otherwise it says what to run.
# Usage: scripts/ensure-systemd.sh
set -euo pipefail

if command -v systemd-analyze >/dev/null 2>&1; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "systemd-analyze is missing: install your distribution's systemd package" >&2
	echo "(Debian/Ubuntu: sudo apt-get install --no-install-recommends systemd)," >&2
	echo "or run the tests without CTXD_REQUIRE_SYSTEMD=1 to skip the unit check" >&2
	exit 1
fi
echo "installing systemd-analyze (Debian's systemd package)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends systemd >/dev/null
command -v systemd-analyze >/dev/null
