#!/usr/bin/env bash
# Makes sure PostgreSQL's server programs (initdb, postgres) are here, for
# the shared store's tests (pgstore, run with CTXD_REQUIRE_POSTGRES=1 by
# make test; internal/pgtest runs a private server from them). They are
# looked for as the harness looks: in $CTXD_POSTGRES_BIN (a bin
# directory), else in the highest version's /usr/lib/postgresql/*/bin
# (Debian's layout), else on PATH. Missing, they are Debian's postgresql
# package: as root this script installs it, otherwise it says what to run.
# Usage: scripts/ensure-postgres.sh
set -euo pipefail

found() {
	[ -x "$1/initdb" ] && [ -x "$1/postgres" ]
}

if [ -n "${CTXD_POSTGRES_BIN:-}" ]; then
	if found "$CTXD_POSTGRES_BIN"; then
		echo "PostgreSQL: $CTXD_POSTGRES_BIN (CTXD_POSTGRES_BIN)"
		exit 0
	fi
	echo "CTXD_POSTGRES_BIN=$CTXD_POSTGRES_BIN holds no initdb and postgres" >&2
	exit 1
fi
for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5nr); do
	if found "$dir"; then
		echo "PostgreSQL: $dir"
		exit 0
	fi
done
if command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1; then
	echo "PostgreSQL: $(dirname "$(command -v postgres)") (PATH)"
	exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "PostgreSQL is missing: install your distribution's server package" >&2
	echo "(Debian/Ubuntu: sudo apt-get install --no-install-recommends postgresql)," >&2
	echo "set CTXD_POSTGRES_BIN to the bin directory of one you have, or run the tests without CTXD_REQUIRE_POSTGRES=1 to skip the shared store's tests" >&2
	exit 1
fi
echo "installing PostgreSQL (Debian's postgresql package)"
export DEBIAN_FRONTEND=noninteractive
# The tests run private servers of their own: the package is not to make
# and start a system-wide cluster.
mkdir -p /etc/postgresql-common/createcluster.d
echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/ctxd-tests.conf
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5nr); do
	if found "$dir"; then
		echo "PostgreSQL: $dir"
		exit 0
	fi
done
echo "the postgresql package installed no initdb and postgres under /usr/lib/postgresql" >&2
exit 1
