// A loopback reverse proxy that adds `Authorization: Bearer $ADF_TOKEN` to
// every request (and changes nothing else, the Host header included), so
// the MCP conformance suite, which cannot send headers, can reach
// `adf mcp serve --http` behind its token. Usage: node auth_proxy.mjs
// LISTEN_PORT TARGET_PORT.
import http from "node:http";

const [listen, target] = process.argv.slice(2).map(Number);
const token = process.env.ADF_TOKEN;
http
  .createServer((req, res) => {
    const headers = { ...req.headers, authorization: `Bearer ${token}` };
    const up = http.request(
      { host: "127.0.0.1", port: target, method: req.method, path: req.url, headers },
      (r) => {
        res.writeHead(r.statusCode, r.headers);
        r.pipe(res);
      },
    );
    up.on("error", () => {
      res.writeHead(502);
      res.end();
    });
    req.pipe(up);
  })
  .listen(listen, "127.0.0.1");
