#!/usr/bin/env bash
# The MCP conformance suite (@modelcontextprotocol/conformance, PEERS.md),
# both ways: its server scenarios against `adf mcp serve --http`, and its
# client scenarios (the handshake, a tool call, and OAuth: discovery,
# dynamic registration, PKCE, scopes, token endpoint auth methods, issuer
# checks) against adf's MCP client through `adf mcp probe`. The 0.2 line
# speaks the 2026-07-28 protocol rmcp 3.11 offers first. The suite needs Node 22 (fs.globSync),
# taken from the npm registry's `node` package; both are pinned and cached
# outside the clone. The suite cannot send headers, so a loopback proxy
# (tests/peers/auth_proxy.mjs) adds the daemon's token and changes nothing
# else. The scenarios run are the ones that apply to a server offering
# tools only: the lifecycle, ping, tools/list and DNS-rebinding protection
# (the others exercise the suite's own fixture tools, resources, prompts,
# logging, sampling and elicitation, which adf's fleet server does not
# offer). Exits non-zero on any failed check. `--install` only installs.
set -euo pipefail
cd "$(dirname "$0")/.."
NODE_V=22
CONF_V=0.2.0-alpha.12
NODE_DIR=/var/cache/adf-peers/node$NODE_V
CONF_DIR=/var/cache/adf-peers/mcp-conformance-$CONF_V
if ! command -v npm >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq nodejs npm
fi
if [ ! -f "$NODE_DIR/.ok" ]; then
  rm -rf "$NODE_DIR" && mkdir -p "$NODE_DIR"
  (cd "$NODE_DIR" && npm i --no-audit --no-fund --loglevel=error "node@$NODE_V")
  touch "$NODE_DIR/.ok"
fi
if [ ! -f "$CONF_DIR/.ok" ]; then
  rm -rf "$CONF_DIR" && mkdir -p "$CONF_DIR"
  (cd "$CONF_DIR" && npm i --no-audit --no-fund --loglevel=error "@modelcontextprotocol/conformance@$CONF_V")
  touch "$CONF_DIR/.ok"
fi
[ "${1:-}" = --install ] && exit 0
NODE="$NODE_DIR/node_modules/.bin/node"
ADF=target/debug/adf
[ -x "$ADF" ] || cargo build -q
HOME_DIR=$(mktemp -d)
export ADF_HOME="$HOME_DIR"
mkdir -p "$HOME_DIR/data/agents"
"$ADF" new "$HOME_DIR/data/agents/scout.adf" --name scout >/dev/null
PORT=18401
PROXY=18402
"$ADF" mcp serve "$HOME_DIR/data/agents" --http "$PORT" 2> "$HOME_DIR/serve.log" &
SPID=$!
trap 'kill "$SPID" "${PPID_:-0}" 2>/dev/null || true; wait "$SPID" 2>/dev/null || true; rm -rf "$HOME_DIR"' EXIT
for _ in $(seq 1 100); do
  [ -s "$HOME_DIR/config/daemon-token" ] && grep -q "mcp serve" "$HOME_DIR/serve.log" && break
  sleep 0.1
done
ADF_TOKEN=$(cat "$HOME_DIR/config/daemon-token") "$NODE" tests/peers/auth_proxy.mjs "$PROXY" "$PORT" &
PPID_=$!
sleep 0.5
FAILED=0
for scenario in server-initialize ping tools-list dns-rebinding-protection; do
  if ! PATH="$(dirname "$NODE"):$PATH" "$NODE" "$CONF_DIR/node_modules/.bin/conformance" server \
      --url "http://127.0.0.1:$PROXY/mcp" --scenario "$scenario" > "$HOME_DIR/$scenario.log" 2>&1 \
      || ! grep -q ", 0 failed" "$HOME_DIR/$scenario.log"; then
    echo "conformance scenario $scenario failed:" >&2
    cat "$HOME_DIR/$scenario.log" >&2
    FAILED=1
  else
    echo "conformance $scenario: $(grep -o 'Passed: [0-9/]*' "$HOME_DIR/$scenario.log")"
  fi
done
# adf's MCP client against the suite's servers: the URL is appended to the
# command. --headless-auth follows the authorization URL without a browser
# (the suite's authorization server approves at once).
PROBE="$(pwd)/$ADF mcp probe --oauth --headless-auth"
run_client() {
  local scenario=$1 command=$2 log
  log="$HOME_DIR/client-${scenario//\//_}.log"
  if ! PATH="$(dirname "$NODE"):$PATH" "$NODE" "$CONF_DIR/node_modules/.bin/conformance" client \
      --command "$command" --scenario "$scenario" > "$log" 2>&1 || ! grep -q "OVERALL: PASSED" "$log"; then
    echo "conformance client scenario $scenario failed:" >&2
    cat "$log" >&2
    FAILED=1
  else
    echo "conformance client $scenario: $(grep -o 'Passed: [0-9/]*' "$log")"
  fi
}
run_client tools_call "$PROBE --call add_numbers --args '{\"a\":1,\"b\":2}'"
for scenario in initialize auth/metadata-default auth/metadata-var1 auth/metadata-var2 auth/metadata-var3 \
    auth/scope-from-www-authenticate auth/scope-from-scopes-supported auth/scope-omitted-when-undefined \
    auth/token-endpoint-auth-basic auth/token-endpoint-auth-post auth/token-endpoint-auth-none \
    auth/2025-03-26-oauth-endpoint-fallback auth/iss-supported-missing auth/iss-wrong-issuer auth/iss-unexpected \
    auth/iss-normalized auth/metadata-issuer-mismatch auth/resource-mismatch; do
  run_client "$scenario" "$PROBE"
done
exit "$FAILED"
