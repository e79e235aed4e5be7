#!/usr/bin/env bash
# The Python MCP SDK (`mcp` from PyPI, ../shared/design/PEERS.md) in a venv
# cached outside the clone, for tests/peers/mcp_server.py. Prints the
# venv's python.
set -euo pipefail
V=1.24.0
VENV=/var/cache/adf-peers/mcp-py-$V
if [ ! -f "$VENV/.ok" ]; then
  if ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
    apt-get update -qq >&2 && apt-get install -y -qq python3-venv >&2
  fi
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q "mcp==$V" >&2
  touch "$VENV/.ok"
fi
echo "$VENV/bin/python"
