// The sandbox realm's set-up, run once per fresh realm before any agent
// code. `__host(name, json)` and `__log(level, text)` are the only ways out;
// both are captured here and removed from the global object.
(function (host, log) {
  "use strict";
  const G = globalThis;
  const stringify = (v) => {
    if (typeof v === "string") return v;
    if (v instanceof Error) return String(v.stack || v);
    try {
      const s = JSON.stringify(v);
      return s === undefined ? String(v) : s;
    } catch (_) {
      return String(v);
    }
  };
  const line = (args) => args.map(stringify).join(" ");
  const console = {
    log: (...a) => log("log", line(a)),
    info: (...a) => log("info", line(a)),
    debug: (...a) => log("log", line(a)),
    warn: (...a) => log("warn", line(a)),
    error: (...a) => log("error", line(a)),
  };
  const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const b64encode = (bytes) => {
    let out = "";
    for (let i = 0; i < bytes.length; i += 3) {
      const n = (bytes[i] << 16) | ((bytes[i + 1] || 0) << 8) | (bytes[i + 2] || 0);
      out += B64[(n >> 18) & 63] + B64[(n >> 12) & 63];
      out += i + 1 < bytes.length ? B64[(n >> 6) & 63] : "=";
      out += i + 2 < bytes.length ? B64[n & 63] : "=";
    }
    return out;
  };
  const b64decode = (text) => {
    const clean = text.replace(/[^A-Za-z0-9+/]/g, "");
    const out = new Uint8Array(Math.floor((clean.length * 3) / 4));
    let o = 0;
    for (let i = 0; i < clean.length; i += 4) {
      const n = (B64.indexOf(clean[i]) << 18) | (B64.indexOf(clean[i + 1]) << 12) |
        ((B64.indexOf(clean[i + 2]) & 63) << 6) | (B64.indexOf(clean[i + 3]) & 63);
      out[o++] = (n >> 16) & 255;
      if (i + 2 < clean.length) out[o++] = (n >> 8) & 255;
      if (i + 3 < clean.length) out[o++] = n & 255;
    }
    return out.subarray(0, o);
  };
  const call = (name, args) => {
    // Bytes travel as base64 (runtime.md §7.3 step 12), and come back as
    // a Uint8Array from sys_fetch.
    if (name === "fs_write" && args && (args.content instanceof Uint8Array || args.content instanceof ArrayBuffer)) {
      const bytes = args.content instanceof ArrayBuffer ? new Uint8Array(args.content) : args.content;
      args = Object.assign({}, args, { content: b64encode(bytes), encoding: "base64" });
      if (!args.mime_type) args.mime_type = "application/octet-stream";
    }
    let json;
    try {
      json = JSON.stringify(args === undefined ? {} : args);
    } catch (e) {
      return Promise.reject(Object.assign(new TypeError("adf." + name + ": arguments are not JSON: " + e.message), { code: "INVALID_INPUT" }));
    }
    const reply = JSON.parse(host(String(name), json));
    if (reply.err) {
      return Promise.reject(Object.assign(new Error(reply.err.message), { code: reply.err.code }));
    }
    let v = reply.ok;
    // Text results stay text (a CSV that looks like JSON is still a CSV).
    if (typeof v === "string" && name !== "doc_text" && name !== "yaml_stringify") {
      try {
        v = JSON.parse(v);
      } catch (_) {}
    }
    if (name === "sys_fetch" && v && v._body_encoding === "base64" && typeof v.body === "string") {
      v.body = b64decode(v.body);
    }
    return Promise.resolve(v);
  };
  const adf = new Proxy(Object.freeze({}), {
    // Not a thenable, not convertible: only named methods.
    get: (_, name) =>
      typeof name === "string" && !["then", "toJSON", "constructor", "valueOf", "toString"].includes(name)
        ? (args) => call(name, args)
        : undefined,
    set: () => false,
    defineProperty: () => false,
  });
  const noExit = () => {
    throw new Error("process.exit is not available in the sandbox");
  };
  const process = Object.freeze({
    env: Object.freeze({}),
    argv: Object.freeze([]),
    cwd: () => "/",
    exit: noExit,
    stdout: Object.freeze({ write: (s) => (log("log", String(s)), true) }),
    stderr: Object.freeze({ write: (s) => (log("error", String(s)), true) }),
  });
  const require = () => {
    throw new ReferenceError("require is not defined in the sandbox; use import");
  };
  const modules = Object.freeze({});
  const __require = async (name) => {
    if (Object.prototype.hasOwnProperty.call(modules, name)) return modules[name];
    throw Object.assign(new Error('Cannot import "' + name + '": modules are not available in this sandbox'), { code: "NOT_FOUND" });
  };
  const fixed = (name, value) =>
    Object.defineProperty(G, name, { value, writable: false, enumerable: false, configurable: false });
  delete G.__host;
  delete G.__log;
  fixed("adf", adf);
  fixed("console", Object.freeze(console));
  fixed("process", process);
  fixed("require", require);
  fixed("__require", __require);
  // Built-ins are shared by all code in the realm: freeze them so no
  // script can reach into another through a patched prototype.
  const seen = new Set();
  const freeze = (o) => {
    if (o === null || (typeof o !== "object" && typeof o !== "function") || seen.has(o)) return;
    seen.add(o);
    Object.freeze(o);
    if (typeof o === "function" && o.prototype) freeze(o.prototype);
    freeze(Object.getPrototypeOf(o));
  };
  for (const name of Object.getOwnPropertyNames(G)) {
    const d = Object.getOwnPropertyDescriptor(G, name);
    if (d && "value" in d && /^[A-Z]/.test(name)) freeze(d.value);
  }
  for (const f of [function () {}, async function () {}, function* () {}, async function* () {}, () => {}]) {
    freeze(Object.getPrototypeOf(f));
  }
  freeze(Object.getPrototypeOf([][Symbol.iterator]()));
  freeze(Object.getPrototypeOf(Object.getPrototypeOf([][Symbol.iterator]())));
  freeze(Object.getPrototypeOf(new Map().entries()));
  freeze(Object.getPrototypeOf(new Set().values()));
  freeze(Object.getPrototypeOf(""[Symbol.iterator]()));
})(__host, __log);
