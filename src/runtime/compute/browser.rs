//! An agent's managed browser (issue 22): Chromium driven over the DevTools
//! protocol (chromiumoxide), one per agent with a profile of its own
//! (cookies, storage, saved logins) under the data folder. It is visible on
//! the agent's desktop when that can run here (so the owner can take over
//! a login through VNC), headless otherwise or when `compute.browser` is
//! false. Every request the page makes passes the egress guard that
//! `sys_fetch` uses (runtime.md §8.7): a page cannot reach the daemon, the
//! cloud's metadata address or, unless the owner allows local fetch, this
//! machine and its network; only http(s), data, blob and about URLs load.
//! Certificate errors are errors. The profile can be sealed into the
//! agent's credentials (`close`) and is restored from them where the agent
//! has none, so a copied file brings its sessions to another machine.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use chromiumoxide::browser::{Browser, BrowserConfig};
use chromiumoxide::cdp::browser_protocol::fetch::{ContinueRequestParams, EventRequestPaused, FailRequestParams};
use chromiumoxide::cdp::browser_protocol::network::ErrorReason;
use chromiumoxide::cdp::browser_protocol::page::{CaptureScreenshotFormat, StopLoadingParams};
use chromiumoxide::page::ScreenshotParams;
use chromiumoxide::{Page, handler::viewport::Viewport};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::runtime::egress::{self, Resolve};

/// The credential a sealed profile is kept under.
pub const PROFILE_SECRET: &str = "browser:profile";
/// Page text `read` returns at most.
const READ_CAP: usize = 50_000;
/// The largest sealed profile.
const PROFILE_CAP: usize = 50 << 20;

pub struct Session {
    browser: tokio::sync::Mutex<Browser>,
    tab: tokio::sync::Mutex<Tab>,
    handler: tokio::task::JoinHandle<()>,
    pub profile: PathBuf,
    pub visible: bool,
    /// URLs the guard refused since they were last taken.
    blocked: Arc<Mutex<Vec<String>>>,
    /// Every connection of the browser goes through it.
    _proxy: super::proxy::Proxy,
}

/// The agent's page and the guard that decides its requests.
struct Tab {
    page: Page,
    guard: tokio::task::JoinHandle<()>,
}

impl Drop for Tab {
    fn drop(&mut self) {
        self.guard.abort();
    }
}

/// A new page whose every request passes the guard.
async fn tab(browser: &Browser, blocked: Arc<Mutex<Vec<String>>>) -> Result<Tab, String> {
    let page = browser.new_page("about:blank").await.map_err(|e| format!("Chromium gave no page: {e}"))?;
    let mut paused = page.event_listener::<EventRequestPaused>().await.map_err(|e| e.to_string())?;
    let p = page.clone();
    let guard = tokio::spawn(async move {
        while let Some(ev) = paused.next().await {
            let (p, list) = (p.clone(), blocked.clone());
            tokio::spawn(async move {
                let id = ev.request_id.clone();
                // The scheme here; the host at the proxy, for every request.
                match scheme_ok(&ev.request.url) {
                    Ok(()) => {
                        let _ = p.execute(ContinueRequestParams::new(id)).await;
                    }
                    Err(why) => {
                        if let Ok(mut l) = list.lock()
                            && l.len() < 100
                        {
                            l.push(format!("{}: {why}", ev.request.url));
                        }
                        let _ = p.execute(FailRequestParams::new(id, ErrorReason::BlockedByClient)).await;
                    }
                }
            });
        }
    });
    Ok(Tab { page, guard })
}

static SESSIONS: LazyLock<Mutex<HashMap<String, Arc<Session>>>> = LazyLock::new(Default::default);
static STARTING: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(Default::default);

/// How the agent's browser is made.
pub struct Options {
    pub allow_local: bool,
    pub visible: bool,
    pub resolver: Arc<dyn Resolve>,
}

/// Chromium on this machine (`ADF_CHROMIUM` names another).
pub fn executable() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ADF_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chromium-headless-shell"]
        .iter()
        .find_map(|n| super::display::on_path(n))
}

/// The agent's profile folder.
pub fn profile_dir(agent_id: &str) -> PathBuf {
    crate::paths::data_dir().join("browser").join(agent_id)
}

pub fn get(agent_id: &str) -> Option<Arc<Session>> {
    SESSIONS.lock().ok()?.get(agent_id).cloned()
}

/// Folders of a profile that are caches, locks or crash reports: not kept.
const SKIP: &[&str] = &[
    "Cache",
    "Code Cache",
    "GPUCache",
    "GrShaderCache",
    "ShaderCache",
    "GraphiteDawnCache",
    "DawnCache",
    "DawnGraphiteCache",
    "DawnWebGPUCache",
    "Crashpad",
    "CacheStorage",
    "ScriptCache",
    "component_crx_cache",
    "extensions_crx_cache",
    "Safe Browsing",
    "optimization_guide_model_store",
    "BrowserMetrics",
    "SingletonLock",
    "SingletonSocket",
    "SingletonCookie",
    "DevToolsActivePort",
    "Crash Reports",
];

/// A profile folder as a compressed archive (caches and locks left out,
/// links not followed).
pub fn archive(dir: &Path) -> Result<Vec<u8>, String> {
    fn walk(b: &mut tar::Builder<Vec<u8>>, root: &Path, dir: &Path, n: &mut usize) -> Result<(), String> {
        let mut entries: Vec<_> =
            std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let name = e.file_name();
            if SKIP.iter().any(|s| name == *s) {
                continue;
            }
            let Ok(t) = e.file_type() else { continue };
            let path = e.path();
            let rel = path.strip_prefix(root).map_err(|e| e.to_string())?.to_path_buf();
            if t.is_dir() {
                walk(b, root, &path, n)?;
            } else if t.is_file() {
                *n += 1;
                if *n > 20_000 {
                    return Err("the profile holds more than 20,000 files".into());
                }
                b.append_path_with_name(&path, &rel).map_err(|e| format!("{}: {e}", rel.display()))?;
            }
        }
        Ok(())
    }
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    let mut n = 0;
    walk(&mut b, dir, dir, &mut n)?;
    let tar = b.into_inner().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let params = brotli::enc::BrotliEncoderParams { quality: 5, ..Default::default() };
    brotli::BrotliCompress(&mut tar.as_slice(), &mut out, &params).map_err(|e| e.to_string())?;
    if out.len() > PROFILE_CAP {
        return Err(format!("the profile is over {} MiB compressed", PROFILE_CAP >> 20));
    }
    Ok(out)
}

/// Unpack an archive `archive` made into `dir` (replacing it). Only plain
/// files and folders, each inside `dir`.
pub fn restore(dir: &Path, bytes: &[u8]) -> Result<usize, String> {
    let mut tar = Vec::new();
    let mut r = brotli::Decompressor::new(bytes, 64 << 10);
    std::io::Read::read_to_end(&mut std::io::Read::take(&mut r, 1 << 30), &mut tar)
        .map_err(|e| format!("the sealed profile is not readable: {e}"))?;
    let tmp = dir.with_extension(format!("restore-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let mut a = tar::Archive::new(tar.as_slice());
    let mut n = 0;
    let entries = a.entries().map_err(|e| e.to_string())?;
    for entry in entries {
        let mut entry = entry.map_err(|e| e.to_string())?;
        let t = entry.header().entry_type();
        if !(t.is_file() || t.is_dir()) {
            continue;
        }
        // unpack_in refuses a path that would leave the folder.
        if entry.unpack_in(&tmp).map_err(|e| e.to_string())? {
            n += 1;
        }
    }
    let _ = std::fs::remove_dir_all(dir);
    if let Some(p) = dir.parent() {
        std::fs::create_dir_all(p).map_err(|e| e.to_string())?;
    }
    std::fs::rename(&tmp, dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(n)
}

/// Schemes a page may load (hosts are the proxy's to decide).
fn scheme_ok(url: &str) -> Result<(), String> {
    match url.split_once(':').map(|(s, _)| s.to_ascii_lowercase()).as_deref() {
        Some("http" | "https" | "ws" | "wss" | "data" | "blob" | "about") => Ok(()),
        Some(other) => Err(format!("{other}: URLs are not loaded by the agent's browser")),
        None => Err(format!("{url}: not a URL")),
    }
}

/// May a page be opened at this URL? `Err` says why not (the guard's
/// reason, before the browser tries).
async fn allowed(url: &str, allow_local: bool, resolver: &dyn Resolve) -> Result<(), String> {
    scheme_ok(url)?;
    let u = url::Url::parse(url).map_err(|e| format!("{url}: {e}"))?;
    match u.scheme() {
        "http" | "https" => egress::check(&u, allow_local, resolver).await.map(|_| ()).map_err(|e| e.to_string()),
        _ => Ok(()),
    }
}

/// Chromium started with a clean environment (nothing of adf's own: no
/// provider keys, no tokens) and the desktop's display: a small launcher
/// beside the profile.
fn launcher(agent_id: &str, exe: &Path, env: &[(String, String)]) -> Result<PathBuf, String> {
    let q = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let mut vars: Vec<(String, String)> = super::display::clean_env();
    vars.extend(env.iter().cloned());
    let assigns: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={}", q(v))).collect();
    let script =
        format!("#!/bin/sh\nexec /usr/bin/env -i {} {} \"$@\"\n", assigns.join(" "), q(&exe.to_string_lossy()));
    let dir = crate::paths::data_dir().join("browser");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{agent_id}.launch"));
    std::fs::write(&path, script).map_err(|e| format!("{}: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).map_err(|e| e.to_string())?;
    }
    Ok(path)
}

impl Session {
    async fn launch(agent_id: &str, opts: &Options, env: Vec<(String, String)>) -> Result<Session, String> {
        let exe = executable().ok_or("no Chromium on this machine (apt-get install chromium)")?;
        let profile = profile_dir(agent_id);
        std::fs::create_dir_all(&profile).map_err(|e| format!("{}: {e}", profile.display()))?;
        let blocked: Arc<Mutex<Vec<String>>> = Arc::default();
        let proxy = super::proxy::start(opts.allow_local, opts.resolver.clone(), blocked.clone()).await?;
        let run = launcher(agent_id, &exe, &env)?;
        let proxy_url = format!("http://127.0.0.1:{}", proxy.port);
        let mut b = BrowserConfig::builder()
            .chrome_executable(&run)
            .user_data_dir(&profile)
            .respect_https_errors()
            .enable_request_intercept()
            .launch_timeout(Duration::from_secs(30))
            .request_timeout(Duration::from_secs(30))
            .window_size(super::display::WIDTH, super::display::HEIGHT)
            .viewport(Viewport { width: 1280, height: 720, ..Default::default() })
            // chromiumoxide adds the dashes: keys and values, not flags.
            .args([
                "no-first-run",
                "no-default-browser-check",
                "disable-background-networking",
                "disable-component-update",
                "disable-sync",
                "disable-quic",
                "disable-gpu",
                "disable-client-side-phishing-detection",
                "disable-default-apps",
                "disable-domain-reliability",
                "disable-search-engine-choice-screen",
                "no-pings",
            ])
            .arg(("password-store", "basic"))
            .arg((
                "disable-features",
                "Translate,MediaRouter,OptimizationHints,AutofillServerCommunication,OptimizationGuideModelDownloading",
            ))
            // Every connection through the guard, loopback's too.
            .arg(("proxy-server", proxy_url.as_str()))
            .arg(("proxy-bypass-list", "<-loopback>"));
        // Chromium's own sandbox cannot start as root.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            b = b.no_sandbox();
        }
        if opts.visible {
            b = b.with_head();
        } else {
            b = b.new_headless_mode();
        }
        let config = b.build()?;
        let (browser, mut handler) =
            Browser::launch(config).await.map_err(|e| format!("Chromium did not start ({}): {e}", exe.display()))?;
        let handler_task = tokio::spawn(async move { while handler.next().await.is_some() {} });
        let t = match tab(&browser, blocked.clone()).await {
            Ok(t) => t,
            Err(e) => {
                handler_task.abort();
                return Err(e);
            }
        };
        Ok(Session {
            browser: tokio::sync::Mutex::new(browser),
            tab: tokio::sync::Mutex::new(t),
            handler: handler_task,
            profile,
            visible: opts.visible,
            blocked,
            _proxy: proxy,
        })
    }

    /// The requests refused since the last call.
    pub fn take_blocked(&self) -> Vec<String> {
        self.blocked.lock().map(|mut l| std::mem::take(&mut *l)).unwrap_or_default()
    }

    async fn page(&self) -> Page {
        self.tab.lock().await.page.clone()
    }

    async fn where_(&self) -> Value {
        let page = self.page().await;
        let url = page.url().await.ok().flatten().unwrap_or_default();
        let title = page.get_title().await.ok().flatten().unwrap_or_default();
        json!({"url": url, "title": title})
    }

    /// Go to a URL; answers once it has loaded, or at `timeout` (the page
    /// then stops loading and stays usable).
    pub async fn open(&self, url: &str, timeout: Duration, opts: &Options) -> Result<Value, String> {
        let u = url::Url::parse(url).map_err(|e| format!("\"{url}\" is not a URL: {e}"))?;
        if !matches!(u.scheme(), "http" | "https") {
            return Err(format!("\"{url}\": only http and https pages are opened"));
        }
        allowed(url, opts.allow_local, opts.resolver.as_ref()).await?;
        let page = self.page().await;
        match tokio::time::timeout(timeout, page.goto(url)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let blocked = self.take_blocked();
                return Err(if blocked.is_empty() {
                    format!("{url} did not load: {e}")
                } else {
                    format!("{url} was refused: {}", blocked.join("; "))
                });
            }
            Err(_) => {
                // The page stops loading, and a fresh one takes its place:
                // the driver would keep waiting for the old navigation.
                let _ = page.execute(StopLoadingParams::default()).await;
                let fresh = {
                    let b = self.browser.lock().await;
                    tab(&b, self.blocked.clone()).await
                };
                let mut t = self.tab.lock().await;
                if let Ok(fresh) = fresh {
                    let old = std::mem::replace(&mut *t, fresh);
                    let _ = old.page.clone().close().await;
                }
                return Err(format!(
                    "{url} did not finish loading in {} ms; loading was stopped and a fresh page opened",
                    timeout.as_millis()
                ));
            }
        }
        let mut v = self.where_().await;
        let blocked = self.take_blocked();
        if !blocked.is_empty() {
            v["blocked"] = json!(blocked);
        }
        Ok(v)
    }

    pub async fn click(&self, selector: &str) -> Result<Value, String> {
        let page = self.page().await;
        let el = page.find_element(selector).await.map_err(|e| format!("no element matches {selector:?}: {e}"))?;
        el.click().await.map_err(|e| format!("{selector:?} could not be clicked: {e}"))?;
        // What the click started (a navigation, a script) gets a moment.
        tokio::time::sleep(Duration::from_millis(150)).await;
        Ok(self.where_().await)
    }

    pub async fn type_into(&self, selector: &str, text: &str, submit: bool) -> Result<Value, String> {
        let page = self.page().await;
        let el = page.find_element(selector).await.map_err(|e| format!("no element matches {selector:?}: {e}"))?;
        el.click().await.map_err(|e| format!("{selector:?} could not be focused: {e}"))?;
        el.type_str(text).await.map_err(|e| e.to_string())?;
        if submit {
            el.press_key("Enter").await.map_err(|e| e.to_string())?;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let mut v = self.where_().await;
        v["typed"] = json!(text.chars().count());
        Ok(v)
    }

    /// The page's text (or an element's), cut at 50,000 characters.
    pub async fn read(&self, selector: Option<&str>) -> Result<Value, String> {
        let sel = serde_json::to_string(&selector).map_err(|e| e.to_string())?;
        let js = format!(
            "(() => {{ const s = {sel}; const el = s ? document.querySelector(s) : document.body; return el ? el.innerText : null; }})()"
        );
        // A page that is navigating has no context to read in yet: wait
        // for it a little.
        let mut tries = 0;
        let r = loop {
            match self.page().await.evaluate(js.as_str()).await {
                Ok(r) => break r,
                Err(e) if tries < 20 && e.to_string().contains("context") => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(format!("the page could not be read: {e}")),
            }
        };
        let text: Option<String> = r.into_value().ok();
        let Some(text) = text else {
            return Err(match selector {
                Some(s) => format!("no element matches {s:?}"),
                None => "the page has no body".into(),
            });
        };
        let mut v = self.where_().await;
        let total = text.chars().count();
        v["text"] = json!(text.chars().take(READ_CAP).collect::<String>());
        if total > READ_CAP {
            v["truncated"] = json!(true);
            v["total_chars"] = json!(total);
        }
        Ok(v)
    }

    pub async fn screenshot(&self, full_page: bool) -> Result<Vec<u8>, String> {
        let p = ScreenshotParams::builder().format(CaptureScreenshotFormat::Png).full_page(full_page).build();
        self.page().await.screenshot(p).await.map_err(|e| format!("no screenshot: {e}"))
    }

    pub async fn back(&self) -> Result<Value, String> {
        self.page().await.evaluate("history.back()").await.map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(self.where_().await)
    }

    /// Close Chromium (its profile written out), then stop its tasks.
    async fn shut(&self) {
        let mut b = self.browser.lock().await;
        let closed = tokio::time::timeout(Duration::from_secs(5), b.close()).await;
        if !matches!(closed, Ok(Ok(_))) {
            let _ = b.kill().await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), b.wait()).await;
        self.tab.lock().await.guard.abort();
        self.handler.abort();
    }
}

/// The agent's browser, started on first use (its sealed profile restored
/// first when it has none here).
pub async fn ensure(
    agent_id: &str,
    opts: &Options,
    sealed: Option<Vec<u8>>,
    env: Vec<(String, String)>,
) -> Result<(Arc<Session>, bool), String> {
    if let Some(s) = get(agent_id) {
        return Ok((s, false));
    }
    let _g = STARTING.lock().await;
    if let Some(s) = get(agent_id) {
        return Ok((s, false));
    }
    let dir = profile_dir(agent_id);
    let mut restored = false;
    if !dir.join("Default").exists()
        && let Some(bytes) = sealed
    {
        let d = dir.clone();
        tokio::task::spawn_blocking(move || restore(&d, &bytes)).await.map_err(|e| e.to_string())??;
        restored = true;
    }
    let s = Arc::new(Session::launch(agent_id, opts, env).await?);
    if let Ok(mut m) = SESSIONS.lock() {
        m.insert(agent_id.to_string(), s.clone());
    }
    Ok((s, restored))
}

/// Close the agent's browser; its profile as an archive, to seal.
pub async fn close(agent_id: &str) -> Result<Option<Vec<u8>>, String> {
    let Some(s) = SESSIONS.lock().ok().and_then(|mut m| m.remove(agent_id)) else { return Ok(None) };
    s.shut().await;
    let dir = s.profile.clone();
    tokio::task::spawn_blocking(move || archive(&dir)).await.map_err(|e| e.to_string())?.map(Some)
}

/// The agent stopped: its browser closes (in the background).
pub fn stop(agent_id: &str) -> Option<tokio::task::JoinHandle<()>> {
    let s = SESSIONS.lock().ok().and_then(|mut m| m.remove(agent_id))?;
    let h = tokio::runtime::Handle::try_current().ok()?;
    Some(h.spawn(async move { s.shut().await }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_round_trips_without_its_caches_and_links() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("p");
        std::fs::create_dir_all(p.join("Default/Cache")).unwrap();
        std::fs::create_dir_all(p.join("Default/Local Storage/leveldb")).unwrap();
        std::fs::write(p.join("Default/Cookies"), b"cookie db").unwrap();
        std::fs::write(p.join("Default/Local Storage/leveldb/000003.log"), b"storage").unwrap();
        std::fs::write(p.join("Default/Cache/data_0"), vec![7u8; 100_000]).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("/etc/passwd", p.join("SingletonLock")).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink("/etc/passwd", p.join("Default/link")).unwrap();
        let a = archive(&p).unwrap();
        assert!(a.len() < 2_000, "caches are left out: {} bytes", a.len());
        let q = d.path().join("q");
        std::fs::create_dir_all(q.join("old")).unwrap();
        assert_eq!(restore(&q, &a).unwrap(), 2);
        assert_eq!(std::fs::read(q.join("Default/Cookies")).unwrap(), b"cookie db");
        assert_eq!(std::fs::read(q.join("Default/Local Storage/leveldb/000003.log")).unwrap(), b"storage");
        assert!(!q.join("Default/Cache").exists() && !q.join("Default/link").exists() && !q.join("old").exists());
        assert!(restore(&q, b"not brotli").is_err());
        assert_eq!(std::fs::read(q.join("Default/Cookies")).unwrap(), b"cookie db", "a bad archive changes nothing");
    }

    #[tokio::test]
    async fn only_web_urls_load_and_the_guard_decides_hosts() {
        let r = egress::SystemResolver;
        assert!(allowed("data:text/html,hi", false, &r).await.is_ok());
        assert!(allowed("file:///etc/passwd", true, &r).await.unwrap_err().contains("file:"));
        assert!(allowed("chrome://settings", true, &r).await.is_err());
        assert!(allowed("http://127.0.0.1:9/", false, &r).await.is_err());
        assert!(allowed("http://127.0.0.1:9/", true, &r).await.is_ok());
        assert!(allowed("http://169.254.169.254/latest", true, &r).await.is_err(), "metadata stays refused");
    }
}
