#!/usr/bin/env bash
# Builds the pinned Ollama from the Go module proxy into OUT.
# Usage: scripts/build-ollama.sh VERSION OUT
#
# v0.6.5 needs only Go and gcc. Later versions (v0.17.x) ship without
# llama.cpp's vendored headers in the module zip: they need Debian's
# nlohmann-json3-dev and libstb-dev, and miniaudio.h, which the
# github.com/gen2brain/malgo module carries.
set -euo pipefail
version=$1
out=$2
go=${GO:-go}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

case "$version" in
v0.6.*) ;;
*)
	need=()
	dpkg -s nlohmann-json3-dev >/dev/null 2>&1 || need+=(nlohmann-json3-dev)
	dpkg -s libstb-dev >/dev/null 2>&1 || need+=(libstb-dev)
	if [ ${#need[@]} -gt 0 ]; then
		echo "installing ${need[*]} for ollama $version"
		sudo=""
		[ "$(id -u)" -eq 0 ] || sudo=sudo
		$sudo apt-get update -qq
		$sudo apt-get install -y -qq "${need[@]}"
	fi
	malgo=$(cd "$tmp" && "$go" mod download -json github.com/gen2brain/malgo@v0.11.24 | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
	# llama.cpp includes "miniaudio/miniaudio.h"; malgo has it at its root.
	# A fixed directory keeps the cgo flags, and so Go's build cache, stable
	# from one build to the next.
	inc="${XDG_CACHE_HOME:-$HOME/.cache}/ctxd-build/include"
	mkdir -p "$inc"
	ln -sfn "$malgo" "$inc/miniaudio"
	export CGO_CPPFLAGS="${CGO_CPPFLAGS:-} -I$inc -I/usr/include/stb"
	;;
esac

# Ollama's Go build compiles ggml for the baseline of the architecture
# (on x86-64: SSE2, no AVX), which on a CPU evaluates prompts about nine
# times slower than the same code built for it (measured with SmolLM2
# 135M: 2,777 tokens in 142 s against 16 s). The binary is built on the
# machine that runs it, so it is built for that machine's CPU where the
# compiler can (CTXD_OLLAMA_CFLAGS overrides, "" for the baseline).
native=${CTXD_OLLAMA_CFLAGS--march=native}
if [ -n "$native" ] && ! echo 'int main(void){return 0;}' | ${CC:-gcc} $native -x c - -o /dev/null 2>/dev/null; then
	echo "the C compiler refuses $native: ollama is built for the architecture's baseline (slower on a CPU)"
	native=""
fi
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} $native" CGO_CXXFLAGS="${CGO_CXXFLAGS:--O2 -g} $native"

GOBIN="$tmp" "$go" install "github.com/ollama/ollama@$version"
mkdir -p "$(dirname "$out")"
mv "$tmp/ollama" "$out"
echo "built $out"
