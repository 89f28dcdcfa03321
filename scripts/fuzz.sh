#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a bounded time each, one
# package and target at a time, and writes a table of the runs into
# docs/reliability.md between <!-- reliability:fuzz --> and
# <!-- /reliability:fuzz -->. Targets are found by grepping for
# `func Fuzz` in *_test.go files, so a new one is picked up.
#
#   FUZZTIME=30s   time per target (go test -fuzztime: a duration, or Nx)
#   FUZZPARALLEL=2 fuzzing workers per target (go test -parallel)
#   FUZZMINIMIZETIME=5s  time to minimize each new input (go test
#                  -fuzzminimizetime; its default, 60s, leaves targets with
#                  large seeds little time to fuzz, and its execs uncounted)
#   FUZZDOC=docs/reliability.md   the page to write ("" writes none)
#
# It stops at nothing: a target that fails is recorded as FAIL, its
# crasher is left in the package's testdata/fuzz/ (a regression seed once
# the bug is fixed), and the script exits 1 after the table is written.
# `make fuzz` runs it; CI does not (it runs only the seed corpora, as
# ordinary tests).
set -uo pipefail

cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-30s}
FUZZPARALLEL=${FUZZPARALLEL:-2}
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-5s}
FUZZDOC=${FUZZDOC-docs/reliability.md}
GO=${GO:-go}

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

# package<TAB>target, sorted.
targets=$(grep -rEo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]+' . |
	grep -v '/\(node_modules\|var\|bin\)/' |
	sed -E 's#^\./##; s#^([^:]*)/[^/]*:func #\1\t#; s#^[^/\t]*:func #.\t#' | sort -u)
if [ -z "$targets" ]; then
	echo "fuzz: no fuzz targets found" >&2
	exit 1
fi

rows=()
failed=0
while IFS=$'\t' read -r dir target; do
	pkg=./$dir
	[ "$dir" = . ] && pkg=.
	out=$log/$target.log
	echo "fuzz: $target in $pkg for $FUZZTIME"
	start=$(date +%s)
	if "$GO" test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" -parallel "$FUZZPARALLEL" "$pkg" >"$out" 2>&1; then
		result=pass
	else
		result=FAIL
		failed=1
		tail -n 20 "$out" | sed 's/^/    /'
	fi
	secs=$(($(date +%s) - start))
	# The last progress line's count (go test prints "execs: N (R/sec)").
	execs=$(grep -Eo 'execs: [0-9]+' "$out" | tail -1 | grep -Eo '[0-9]+' || true)
	corpus=$(grep -Eo 'total: [0-9]+' "$out" | tail -1 | grep -Eo '[0-9]+' || true)
	seeds=0
	[ -d "$dir/testdata/fuzz/$target" ] && seeds=$(find "$dir/testdata/fuzz/$target" -type f | wc -l | tr -d ' ')
	rate=-
	if [ -n "$execs" ] && [ "$secs" -gt 0 ]; then
		rate=$((execs / secs))
	fi
	rows+=("| \`$target\` | \`${pkg#./}\` | ${secs}s | ${execs:--} | ${rate} | ${corpus:--} | ${seeds} | ${result} |")
	echo "fuzz: $target: $result, ${execs:-?} execs in ${secs}s"
done <<<"$targets"

table=$(
	echo "Measured by \`FUZZTIME=$FUZZTIME FUZZPARALLEL=$FUZZPARALLEL FUZZMINIMIZETIME=$FUZZMINIMIZETIME ./scripts/fuzz.sh\` (\`make fuzz\` runs it with"
	echo "30s a target; not in CI, which runs the seed corpora as ordinary tests) on $(date -u +%Y-%m-%d),"
	echo "$("$GO" env GOVERSION), $(nproc 2>/dev/null || echo ?) CPUs shared with other work: execs per second vary with"
	echo "the machine's load and are no benchmark. Each target runs alone:"
	echo "\`go test -run '^\$' -fuzz '^FuzzX\$' -fuzztime $FUZZTIME -fuzzminimizetime $FUZZMINIMIZETIME -parallel $FUZZPARALLEL ./pkg\`."
	echo "Execs counts the fuzzing loop's runs (not minimization's); corpus is the inputs"
	echo "the fuzzer kept (seeds and cache included); seeds are the checked-in files under the"
	echo "package's \`testdata/fuzz/FuzzX/\`."
	echo
	echo "| Target | Package | Time | Execs | Execs/s | Corpus | Seed files | Result |"
	echo "|---|---|---|---|---|---|---|---|"
	printf '%s\n' "${rows[@]}"
)

if [ -n "$FUZZDOC" ]; then
	if ! grep -q '<!-- reliability:fuzz -->' "$FUZZDOC" || ! grep -q '<!-- /reliability:fuzz -->' "$FUZZDOC"; then
		echo "fuzz: $FUZZDOC has no <!-- reliability:fuzz --> section" >&2
		exit 1
	fi
	TABLE=$table awk '
		/<!-- reliability:fuzz -->/ { print; print ENVIRON["TABLE"]; skip = 1; next }
		/<!-- \/reliability:fuzz -->/ { skip = 0 }
		!skip { print }
	' "$FUZZDOC" >"$log/doc" && cat "$log/doc" >"$FUZZDOC"
	echo "fuzz: wrote the table into $FUZZDOC"
else
	printf '%s\n' "$table"
fi
exit "$failed"
