#!/usr/bin/env bash
# The governor's time on overflow turns, before and after, side by side:
# BenchmarkPrepareOverflow (orchestrator/governor_bench_test.go) built from
# a base commit (given this tree's copy of the benchmark file, which uses
# the orchestrator's exported API only) and from this working tree, run
# alternately ROUNDS times each, BENCHTIME turns a run. Prints every run
# and the medians; with --write, writes them into docs/benchmarks.md
# between the bench:governor markers (appending the section if there are
# none).
# Usage: scripts/bench-governor.sh [--write] [BASE] [ROUNDS] [BENCHTIME]
#   defaults: BASE 90e4b3b (before issue 24's incremental governor), 7 rounds, 20x
set -euo pipefail
cd "$(dirname "$0")/.."
write=0
if [ "${1:-}" = --write ]; then
	write=1
	shift
fi
base=${1:-90e4b3b}
rounds=${2:-7}
benchtime=${3:-20x}
doc=docs/benchmarks.md
tmp=$(mktemp -d)
cleanup() {
	git worktree remove --force "$tmp/base" >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT

base_sha=$(git rev-parse --short "$base")
head_sha=$(git rev-parse --short HEAD)
dirty=""
git diff --quiet HEAD -- orchestrator governor runcontext tokencount || dirty=" with uncommitted changes"
echo "building the benchmark at $base_sha (base) and at $head_sha$dirty (this tree)" >&2
git worktree add --detach "$tmp/base" "$base" >/dev/null 2>&1
cp orchestrator/governor_bench_test.go "$tmp/base/orchestrator/"
(cd "$tmp/base" && go test -c -o "$tmp/base.test" ./orchestrator/)
go test -c -o "$tmp/head.test" ./orchestrator/

# metric NAME: the value before NAME on a benchmark line.
metric() { awk -v m="$1" '{for (i = 2; i <= NF; i++) if ($i == m) print $(i-1)}'; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for i in $(seq "$rounds"); do
	for side in base head; do
		line=$(cd orchestrator && "$tmp/$side.test" -test.run '^$' -test.bench '^BenchmarkPrepareOverflow$' -test.benchtime "$benchtime" | grep '^BenchmarkPrepareOverflow')
		echo "$side $line" | tee -a "$tmp/runs" >&2
	done
done

side() { grep "^$1 " "$tmp/runs"; }
gov_base=$(side base | metric governor-ms/op | median)
gov_head=$(side head | metric governor-ms/op | median)
ask_base=$(side base | metric ns/op | median)
ask_head=$(side head | metric ns/op | median)
tok_base=$(side base | metric tokenized-kB/op | median)
tok_head=$(side head | metric tokenized-kB/op | median)
all_base=$(side base | metric governor-ms/op | paste -sd, - | sed 's/,/, /g')
all_head=$(side head | metric governor-ms/op | paste -sd, - | sed 's/,/, /g')
full=$(side head | metric full-prompt-tokens | head -1)
budget=$(side head | metric budget-tokens | head -1)
cost=$(metric tokenizer-ns/byte < "$tmp/runs" | median)

section=$(awk -v when="$(date -u +%Y-%m-%dT%H:%M:%SZ)" -v cores="$(nproc)" -v go="$(go env GOVERSION)" \
	-v rounds="$rounds" -v benchtime="$benchtime" -v base="$base_sha" -v head="$head_sha$dirty" \
	-v gb="$gov_base" -v gh="$gov_head" -v ab="$ask_base" -v ah="$ask_head" -v tb="$tok_base" -v th="$tok_head" \
	-v allb="$all_base" -v allh="$all_head" -v full="$full" -v budget="$budget" -v cost="$cost" 'BEGIN {
	printf "Measured %s by `scripts/bench-governor.sh` (%s cores, %s): `BenchmarkPrepareOverflow` built at %s (before) and %s (after), run alternately, %s runs each (`-benchtime %s`); medians of the runs.\n\n", when, cores, go, base, head, rounds, benchtime
	printf "Each turn asks in a new session of its own (12 turns of client history, a 32 kB RAG codex block, 24 karma entries, 24 excerpts of 1.2 kB): %s tokens, for a prompt budget of %s. The governor leaves out all 24 excerpts one by one, then 12 karma entries, then 4 one by one. Its tokenizer makes a token of each byte at %.0f ns a byte (the order of llama.cpp'"'"'s).\n\n", full, budget, cost
	printf "| | governor per turn | tokenized per turn | whole ask per turn |\n|---|---|---|---|\n"
	printf "| before (%s) | %.2f ms | %.0f kB | %.2f ms |\n", base, gb, tb, ab / 1e6
	printf "| after (%s) | %.2f ms | %.0f kB | %.2f ms |\n", head, gh, th, ah / 1e6
	printf "| before / after | **%.1f×** | %.1f× | %.1f× |\n\n", gb / gh, tb / th, ab / ah
	printf "The governor'"'"'s time per turn in each run, ms: before %s; after %s.", allb, allh
}')
echo "$section"
if [ "$write" = 1 ]; then
	begin='<!-- bench:governor:begin (written by scripts/bench-governor.sh) -->'
	end='<!-- bench:governor:end -->'
	if ! grep -qF "$begin" "$doc"; then
		printf '\n## The governor on overflow turns (issue 24)\n\n`scripts/bench-governor.sh --write` measures the governor side by side before and after it became incremental (the prompt counted whole once, each step adjusting the count by what it removed, and what is sent counted whole again) and writes this section.\n\n%s\n%s\n' "$begin" "$end" >> "$doc"
	fi
	SECTION="$section" BEGIN="$begin" END="$end" perl -0pi -e 's/\Q$ENV{BEGIN}\E.*?\Q$ENV{END}\E/$ENV{BEGIN}\n$ENV{SECTION}\n$ENV{END}/s' "$doc"
	echo "wrote $doc" >&2
fi
