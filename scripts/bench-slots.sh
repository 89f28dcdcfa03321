#!/usr/bin/env bash
# What a second Ollama slot costs the first, on this machine: the same
# prompt's evaluation time with OLLAMA_NUM_PARALLEL=1, with 2 and the other
# slot empty, and with 2 and the other slot holding a prompt as long.
# llama.cpp (under Ollama v0.6.5) keeps every slot in one KV cache, and a
# batch attends over every cell in use, so a busy neighbour slows a slot
# down. Writes its table between the bench:slots markers of
# docs/benchmarks.md.
# Usage: scripts/bench-slots.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
model=var/models/ctxd-demo.gguf
[ -x bin/ctxd ] || make build
[ -x bin/ollama ] || make ollama
[ -f "$model" ] || make "$model"
work=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT
digest=sha256:$(sha256sum "$model" | cut -d' ' -f1)
port=$((20000 + RANDOM % 20000))

# measure PARALLEL FILL: median prompt evaluation (ms) of a ~3,800-token
# prompt, after FILL prompts as long, sent at once, have filled FILL slots.
# A request takes the free slot with the longest common prefix (the lowest
# on a tie), so with every slot filled it evicts one and the others stay.
measure() {
	local parallel=$1 fill=$2
	OLLAMA_HOST=127.0.0.1:$port OLLAMA_MODELS=$work/models HOME=$work OLLAMA_NUM_PARALLEL=$parallel \
		bin/ollama serve >"$work/log" 2>&1 &
	pid=$!
	for _ in $(seq 50); do curl -sf "http://127.0.0.1:$port/" >/dev/null && break; sleep 0.2; done
	curl -sf -T "$model" -X POST "http://127.0.0.1:$port/api/blobs/$digest"
	curl -sf "http://127.0.0.1:$port/api/create" -d "{\"model\":\"demo\",\"files\":{\"model.gguf\":\"$digest\"},\"stream\":false}" >/dev/null
	python3 - "$port" "$fill" "$runs" <<'PY'
import json, sys, threading, urllib.request
port, fill, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prompt = " ".join("Handler%d serves kind %d." % (i, i) for i in range(300))
def gen(p):
    body = {"model": "demo", "prompt": p, "raw": True, "stream": False,
            "options": {"num_ctx": 4096, "num_predict": 4, "seed": 1}}
    req = urllib.request.Request("http://127.0.0.1:%s/api/generate" % port, data=json.dumps(body).encode())
    return json.load(urllib.request.urlopen(req))["prompt_eval_duration"] / 1e6
gen("warm up")
ts = [threading.Thread(target=gen, args=("fill%d " % i + prompt,)) for i in range(fill)]
for t in ts: t.start()
for t in ts: t.join()
ms = sorted(gen("run%d " % i + prompt) for i in range(runs))
print("%.0f" % ms[len(ms) // 2])
PY
	kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
	rm -rf "$work/models"
}

one=$(measure 1 0)
two_empty=$(measure 2 0)
two_busy=$(measure 2 2)
table=$(cat <<TABLE
| \`OLLAMA_NUM_PARALLEL\` | the other slot | prompt evaluation, median of $runs |
|---|---|---|
| 1 | — | $one ms |
| 2 | empty | $two_empty ms |
| 2 | holds a prompt as long | $two_busy ms |
TABLE
)
echo "$table"
doc=docs/benchmarks.md
python3 - "$doc" "$table" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "Ollama $(basename "$(readlink -f bin/ollama)" | sed s/^ollama-//)" <<'PY'
import sys
doc, table, when, version = sys.argv[1:]
begin, end = "<!-- bench:slots:begin (written by scripts/bench-slots.sh) -->", "<!-- bench:slots:end -->"
text = open(doc).read()
i, j = text.find(begin), text.find(end)
if i < 0 or j < i:
    sys.exit("%s: no bench:slots markers" % doc)
block = "%s\nMeasured %s with %s (demo model, a 3,790-token prompt, num_ctx 4096 per slot):\n\n%s\n%s" % (begin, when, version, table, end)
open(doc, "w").write(text[:i] + block + text[j + len(end):])
PY
