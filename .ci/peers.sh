#!/usr/bin/env bash
# Installs every peer the suites after `cargo test` need, so .ci/run can do
# it in the background while the Rust builds hold the CPU: the missing
# Debian packages in two apt-get calls (touching STATE/apt.done after them, which
# .ci/run waits for before `cargo test` so no test sees a half-installed
# package), then llama-server (a 25-CPU-minute C++ build, niced so it only
# takes the cycles the builds and tests leave idle) alongside the Python
# venvs and npm packages. Each script it calls keeps its own guarded install
# and cache (outside the clone), so each still runs alone; with the caches
# warm this takes seconds. Exits non-zero if anything failed.
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${1:?usage: peers.sh STATE_DIR}
mkdir -p "$STATE"
export DEBIAN_FRONTEND=noninteractive

echo "== [$SECONDS s] Debian packages"
# What is missing, by the same checks the scripts make (a machine may have
# a tool from elsewhere: Node from NodeSource conflicts with Debian's npm).
WITH=() BARE=()
command -v ip >/dev/null 2>&1 || WITH+=(iproute2)
command -v python3 >/dev/null 2>&1 || WITH+=(python3 python3-pip)
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || WITH+=(python3-venv)
command -v npm >/dev/null 2>&1 || WITH+=(nodejs npm)
{ [ -x /usr/sbin/sshd ] && command -v tmux && command -v ssh; } >/dev/null 2>&1 \
  || BARE+=(openssh-server openssh-client tmux)
{ [ -x /usr/sbin/dovecot ] && [ -x /usr/lib/dovecot/dovecot-lda ] && command -v openssl; } >/dev/null 2>&1 \
  || BARE+=(dovecot-imapd openssl)
{ command -v chromium && command -v wrk && command -v Xvfb && command -v x11vnc && command -v openbox; } >/dev/null 2>&1 \
  || BARE+=(chromium wrk fonts-dejavu-core xvfb xauth xdotool scrot xclip x11vnc openbox)
{ command -v podman && command -v mmdebstrap && command -v iptables && command -v runc; } >/dev/null 2>&1 \
  || BARE+=(podman runc crun slirp4netns uidmap fuse-overlayfs mmdebstrap iptables ca-certificates)
if [ ${#WITH[@]} -gt 0 ] || [ ${#BARE[@]} -gt 0 ]; then
  apt-get update -qq
  [ ${#WITH[@]} -eq 0 ] || apt-get install -y -qq "${WITH[@]}"
  [ ${#BARE[@]} -eq 0 ] || apt-get install -y -qq --no-install-recommends "${BARE[@]}"
fi
touch "$STATE/apt.done"

echo "== [$SECONDS s] llama-server (niced, in the background), venvs and npm packages"
nice -n 19 bash .ci/llama.sh > "$STATE/llama.log" 2>&1 &
LLAMA=$!
bash .ci/mcp.sh
bash .ci/mcp-py.sh
bash .ci/mail.sh --install
bash .ci/schemathesis.sh --install
bash .ci/mcp-conformance.sh --install
python3 -c "import websockets" 2>/dev/null || python3 -m pip install -q websockets
if ! wait "$LLAMA"; then
  tail -40 "$STATE/llama.log"
  echo "error: llama-server did not build" >&2
  exit 1
fi
echo "== [$SECONDS s] peers ready"
