#!/usr/bin/env bash
# Codex loading benchmark, side by side with two anchors, on one tree
# (default: Go's own source tree), written into docs/benchmarks.md between
# the bench:codex markers:
#   - reading every byte:  find TREE -type f | xargs cat > /dev/null
#   - repomix 1.18.1 (npm): walk, ignore files, secret check, pack, count tokens
#   - ctxd codex bench:     the codex service as the daemon runs it, with the
#                           model's own tokenizer: a first load with empty
#                           state (walk, ignore files, read, redact, decide
#                           CAG/RAG, build the retrieval index), a reload of
#                           the unchanged tree after a restart (stat index),
#                           and a reload after one file changed
# Usage: scripts/bench-codex.sh [TREE] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
tree=${1:-$(go env GOROOT)/src}
runs=${2:-3}
model=var/models/ctxd-demo.gguf
out=var/bench
doc=docs/benchmarks.md
mkdir -p "$out"
[ -x bin/ctxd ] || make build
[ -f "$model" ] || make "$model"
if [ ! -x "$out/node_modules/.bin/repomix" ]; then
	echo "installing repomix 1.18.1 into $out (npm)" >&2
	(cd "$out" && npm install --no-audit --no-fund --silent repomix@1.18.1)
fi

# seconds runs the command and prints its wall time in seconds.
seconds() {
	local start end
	start=$(date +%s.%N)
	"$@" >/dev/null 2>&1
	end=$(date +%s.%N)
	awk -v s="$start" -v e="$end" 'BEGIN { printf "%.3f\n", e - s }'
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

files=$(find "$tree" -type f | wc -l)
bytes=$(du -sb "$tree" | cut -f1)
echo "tree: $tree ($files files, $bytes bytes); $runs runs each; $(nproc) cores" >&2
cat_s=$(for _ in $(seq "$runs"); do seconds sh -c "find '$tree' -type f -print0 | xargs -0 cat > /dev/null"; done | median)
echo "read every byte (find | xargs cat): median ${cat_s}s" >&2
repomix_s=$(for _ in $(seq "$runs"); do seconds "$out/node_modules/.bin/repomix" "$tree" -o "$out/repomix-out.xml" --quiet; done | median)
echo "repomix 1.18.1: median ${repomix_s}s" >&2
bin/ctxd codex bench --runs "$runs" --json --gguf "$model" "$tree" > "$out/codex-bench.json"

section=$(jq -r --arg cat "$cat_s" --arg repomix "$repomix_s" --arg when "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
	--arg files "$files" --arg bytes "$bytes" --arg go "$(go env GOVERSION)" --arg cores "$(nproc)" '
  def med: sort | .[(length-1)/2|floor];
  def s: round / 1000;
  def r2: . * 100 | round / 100;
  (.first_load_ms|med) as $first | (.reload_unchanged_ms|med) as $reload | (.reload_one_changed_ms|med) as $changed |
  "Measured \($when) by `scripts/bench-codex.sh` (medians of \(.first_load_ms|length) runs, \($cores) cores). Tree: \($go) `\(.tree)`, \($files) files, \($bytes) bytes; ctxd keeps \(.files) files (\(.bytes) bytes, \(.lines) lines; \(.skipped) skipped: binaries, files over 1 MiB, invalid UTF-8), \(.tokens) tokens with the demo model'"'"'s tokenizer (\(.tokenizer), llama.cpp through the cgo `llama` package; longest token \(.longest_token_bytes) bytes), \(.redactions) credentials redacted. Window: `num_ctx` \(.num_ctx).",
  "",
  "| | median wall time | vs repomix | vs reading the bytes |",
  "|---|---|---|---|",
  "| read every byte (`find \\| xargs cat`) | \($cat) s | | 1× |",
  "| repomix 1.18.1 | \($repomix) s | 1× | |",
  "| ctxd first load, empty state: decided and indexed | \($first|s) s | \(($repomix|tonumber) / ($first/1000) | r2)× faster | |",
  "| ctxd reload after a restart, unchanged tree | \($reload|s) s (files read: \(.reload_unchanged_files_read|map(tostring)|join(", "))) | | \(($reload/1000) / ($cat|tonumber) | r2)× |",
  "| ctxd reload, one file changed | \($changed|s) s (files read: \(.reload_one_changed_files_read|map(tostring)|join(", ")); re-indexed: \(.reload_one_changed_files_reindexed|map(tostring)|join(", "))) | | \(($changed/1000) / ($cat|tonumber) | r2)× |",
  "",
  "The decision: \(.mode) — \(.reason). Tokens counted to make it: none beyond what the reason says; the whole-tree total (\(.tokens) tokens) was counted afterwards in the background, in \(.background_count_ms/1000 | r2) s at the lowest CPU priority. A search of the index (\(.index_bytes) bytes, contentless FTS5) took \(.search_ms) ms."
' "$out/codex-bench.json")
echo "$section"
begin='<!-- bench:codex:begin (written by scripts/bench-codex.sh) -->'
end='<!-- bench:codex:end -->'
if grep -qF "$begin" "$doc"; then
	SECTION="$section" BEGIN="$begin" END="$end" perl -0pi -e 's/\Q$ENV{BEGIN}\E.*?\Q$ENV{END}\E/$ENV{BEGIN}\n$ENV{SECTION}\n$ENV{END}/s' "$doc"
	echo "wrote $doc" >&2
else
	echo "$doc has no bench:codex markers; section not written" >&2
fi
