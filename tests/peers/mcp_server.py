"""A strict MCP server on the official Python SDK (`mcp` on PyPI), the peer
adf's MCP client is tested against: over stdio by default, or Streamable
HTTP on loopback (`--http PORT`) refusing any request whose Authorization
header is not `Bearer $MCP_TEST_TOKEN` (401, as a real server does).

Tools: `echo`, `env` (one variable of the server's own environment),
`where` (its HOME and working folder), `pid`, `crash` (the process exits
at once, mid-call). With `--variant-file F` holding `2`, `echo` lists a
different schema (for the reconcile rules)."""

import argparse
import os
import sys

from mcp.server.fastmcp import FastMCP

parser = argparse.ArgumentParser()
parser.add_argument("--http", type=int)
parser.add_argument("--variant-file")
args = parser.parse_args()

variant = "1"
if args.variant_file and os.path.exists(args.variant_file):
    with open(args.variant_file) as f:
        variant = f.read().strip()

mcp = FastMCP("adf-test-peer", host="127.0.0.1", port=args.http or 8000)

if variant == "2":

    @mcp.tool()
    def echo(text: str, times: int = 1) -> str:
        """Echo the text, several times."""
        return text * times

else:

    @mcp.tool()
    def echo(text: str) -> str:
        """Echo the text."""
        return text


@mcp.tool()
def env(name: str) -> str:
    """One variable of this server's environment ('' when unset)."""
    return os.environ.get(name, "")


@mcp.tool()
def where() -> str:
    """HOME and the working folder."""
    return f"{os.environ.get('HOME', '')}|{os.getcwd()}"


@mcp.tool()
def pid() -> int:
    """This process's id."""
    return os.getpid()


@mcp.tool()
def crash() -> str:
    """Exit at once, mid-call."""
    print("crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


if args.http:
    import uvicorn

    token = os.environ.get("MCP_TEST_TOKEN", "")
    inner = mcp.streamable_http_app()

    async def app(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization", b"").decode() != f"Bearer {token}":
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": b'{"error":"unauthorized"}'})
                return
        await inner(scope, receive, send)

    uvicorn.run(app, host="127.0.0.1", port=args.http, log_level="warning", lifespan="on")
else:
    mcp.run()
