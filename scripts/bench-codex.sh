#!/usr/bin/env bash
# Codex loading benchmark, side by side with two anchors, on one tree
# (default: Go's own source tree):
#   - reading every byte:  find TREE -type f | xargs cat > /dev/null
#   - repomix 1.18.1 (npm): walk, ignore files, secret check, pack, count tokens
#   - ctxd codex bench:     walk, ignore files, redact, render, count with the
#                           model's own tokenizer; then an unchanged reload and
#                           a reload after one file changed (content-hash cache)
# Usage: scripts/bench-codex.sh [TREE] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
tree=${1:-$(go env GOROOT)/src}
runs=${2:-3}
model=var/models/ctxd-demo.gguf
out=var/bench
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

echo "tree: $tree ($(find "$tree" -type f | wc -l) files, $(du -sb "$tree" | cut -f1) bytes); $runs runs each; $(nproc) cores" >&2
cat_s=$(for _ in $(seq "$runs"); do seconds sh -c "find '$tree' -type f -print0 | xargs -0 cat > /dev/null"; done | median)
echo "read every byte (find | xargs cat): median ${cat_s}s" >&2
repomix_s=$(for _ in $(seq "$runs"); do seconds "$out/node_modules/.bin/repomix" "$tree" -o "$out/repomix-out.xml" --quiet; done | median)
echo "repomix 1.18.1: median ${repomix_s}s" >&2
bin/ctxd codex bench --runs "$runs" --json --gguf "$model" "$tree" > "$out/codex-bench.json"
jq -r --arg cat "$cat_s" --arg repomix "$repomix_s" '
  def med: sort | .[(length-1)/2|floor];
  "ctxd: \(.files) files, \(.bytes) bytes, \(.tokens) tokens (\(.tokenizer)), \(.redactions) redactions",
  "first load     median \((.first_load_ms|med)/1000) s",
  "reload         median \((.reload_unchanged_ms|med)/1000) s",
  "one changed    median \((.reload_one_changed_ms|med)/1000) s, files re-counted \(.recounted_files_after_one_change)",
  "anchors: cat \($cat) s, repomix \($repomix) s",
  "ratios: repomix/ctxd-first \(($repomix|tonumber) / ((.first_load_ms|med)/1000)), repomix/ctxd-reload \(($repomix|tonumber) / ((.reload_unchanged_ms|med)/1000)), ctxd-reload/cat \(((.reload_unchanged_ms|med)/1000) / ($cat|tonumber))"
' "$out/codex-bench.json"
