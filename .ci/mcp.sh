#!/usr/bin/env bash
# The reference MCP servers from the npm registry (../shared/design/PEERS.md),
# pinned and cached outside the clone. Prints the node_modules folder.
set -euo pipefail
V=2026.8.31
DIR=/var/cache/adf-peers/mcp-npm-$V
if [ ! -f "$DIR/.ok" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    apt-get update -qq >&2 && apt-get install -y -qq nodejs npm >&2
  fi
  rm -rf "$DIR"
  mkdir -p "$DIR"
  (cd "$DIR" && npm i --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/server-everything@$V" "@modelcontextprotocol/server-filesystem@$V" >&2)
  touch "$DIR/.ok"
fi
echo "$DIR/node_modules"
