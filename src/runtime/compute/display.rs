//! An agent's desktop (issue 22): an X display of its own (Xvfb, with an
//! X authority cookie so only what adf starts may draw on it or read it), a
//! window manager when one is installed (Openbox), and, when the owner
//! wants to watch or take over, a VNC server on loopback with a one-time
//! password (`x11vnc`), reached through an SSH tunnel. The agent sees the
//! screen by screenshots (`scrot`) and acts with the mouse, the keyboard
//! and the clipboard (`xdotool`, `xclip`); programs it starts on the host
//! (`compute_exec`, gated as ever) get its `DISPLAY`. Everything it started
//! goes when the agent stops.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub const WIDTH: u32 = 1280;
pub const HEIGHT: u32 = 800;

/// Openbox's whole configuration on an agent's desktop.
const OPENBOX_RC: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<openbox_config xmlns="http://openbox.org/3.4/rc">
  <focus><focusNew>yes</focusNew><followMouse>no</followMouse></focus>
  <placement><policy>Smart</policy></placement>
  <desktops><number>1</number></desktops>
  <keyboard></keyboard>
  <mouse>
    <context name="Frame"><mousebind button="Left" action="Press"><action name="Focus"/><action name="Raise"/></mousebind></context>
    <context name="Client"><mousebind button="Left" action="Press"><action name="Focus"/><action name="Raise"/></mousebind></context>
    <context name="Titlebar"><mousebind button="Left" action="Drag"><action name="Move"/></mousebind></context>
  </mouse>
  <menu></menu>
</openbox_config>
"#;

/// xdotool's command names: a word of `keys` that is one would start
/// that command (xdotool chains them; `exec` runs a program).
const XDOTOOL_COMMANDS: &[&str] = &[
    "behave",
    "behave_screen_edge",
    "click",
    "exec",
    "get_desktop",
    "get_desktop_for_window",
    "get_desktop_viewport",
    "get_num_desktops",
    "getactivewindow",
    "getmouselocation",
    "getwindowfocus",
    "getwindowgeometry",
    "getwindowname",
    "getwindowpid",
    "key",
    "keydown",
    "keyup",
    "mousedown",
    "mousemove",
    "mousemove_relative",
    "mouseup",
    "search",
    "selectwindow",
    "set_desktop",
    "set_desktop_for_window",
    "set_desktop_viewport",
    "set_num_desktops",
    "set_window",
    "sleep",
    "type",
    "windowactivate",
    "windowclose",
    "windowfocus",
    "windowkill",
    "windowmap",
    "windowminimize",
    "windowmove",
    "windowquit",
    "windowraise",
    "windowreparent",
    "windowsize",
    "windowstate",
    "windowunmap",
    "getdisplaygeometry",
    "version",
    "help",
];

/// One key or chord (`Return`, `ctrl+l`, `shift+Tab`), else why not.
fn key_ok(k: &str) -> Result<(), String> {
    let plain = k.split('+').all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
    if !plain || k.len() > 64 {
        return Err(format!("{k:?} is not a key name (letters, digits and _, chords joined by +: ctrl+l, Return)"));
    }
    if XDOTOOL_COMMANDS.contains(&k.to_ascii_lowercase().as_str()) {
        return Err(format!("{k:?} is not a key name"));
    }
    Ok(())
}

/// A running desktop.
pub struct Display {
    pub number: u32,
    pub auth: PathBuf,
    dir: PathBuf,
    procs: Mutex<Vec<tokio::process::Child>>,
    vnc: Mutex<Option<Vnc>>,
}

/// The VNC server of a desktop the owner watches.
#[derive(Clone, Debug)]
pub struct Vnc {
    pub port: u16,
    pub password: String,
}

static DISPLAYS: LazyLock<Mutex<HashMap<String, Arc<Display>>>> = LazyLock::new(Default::default);
static STARTING: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(Default::default);

pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// What a desktop needs that this machine lacks.
pub fn missing() -> Vec<&'static str> {
    ["Xvfb", "xauth", "xdotool", "scrot", "xclip"].into_iter().filter(|p| on_path(p).is_none()).collect()
}

/// The environment of everything on the desktop: enough to run, nothing
/// of adf's own (no provider keys, no tokens).
pub fn clean_env() -> Vec<(String, String)> {
    let mut env = vec![("PATH".to_string(), "/usr/local/bin:/usr/bin:/bin".to_string())];
    for k in ["HOME", "USER", "LOGNAME", "LANG", "TZ"] {
        if let Ok(v) = std::env::var(k) {
            env.push((k.to_string(), v));
        }
    }
    env
}

fn spawn(program: &str, args: &[&str], env: &[(String, String)]) -> Result<tokio::process::Child, String> {
    let mut c = tokio::process::Command::new(program);
    c.args(args)
        .env_clear()
        .envs(clean_env())
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    c.spawn().map_err(|e| format!("cannot start {program}: {e}"))
}

fn free_display() -> Option<u32> {
    (90..400).find(|n| {
        !Path::new(&format!("/tmp/.X11-unix/X{n}")).exists() && !Path::new(&format!("/tmp/.X{n}-lock")).exists()
    })
}

fn random_hex(n: usize) -> String {
    crate::identity::hex(&(0..n).map(|_| rand::random::<u8>()).collect::<Vec<_>>())
}

impl Display {
    /// `DISPLAY` and `XAUTHORITY` for a program on this desktop.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![("DISPLAY".into(), format!(":{}", self.number)), ("XAUTHORITY".into(), self.auth.to_string_lossy().into())]
    }

    async fn start(agent_id: &str) -> Result<Display, String> {
        let lack = missing();
        if !lack.is_empty() {
            return Err(format!(
                "a desktop needs {} on this machine (apt-get install xvfb xauth xdotool scrot xclip)",
                lack.join(", ")
            ));
        }
        let dir = crate::paths::data_dir().join("desktop").join(agent_id);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        }
        let number = free_display().ok_or("no free X display number (90-399)")?;
        let auth = dir.join("Xauthority");
        let _ = std::fs::remove_file(&auth);
        let cookie = random_hex(16);
        let a = auth.to_string_lossy().into_owned();
        let st = tokio::process::Command::new("xauth")
            .args(["-q", "-f", &a, "add", &format!(":{number}"), ".", &cookie])
            .stdin(std::process::Stdio::null())
            .status()
            .await
            .map_err(|e| format!("cannot run xauth: {e}"))?;
        if !st.success() {
            return Err("xauth could not write the display's cookie".into());
        }
        let screen = format!("{WIDTH}x{HEIGHT}x24");
        let x = spawn("Xvfb", &[&format!(":{number}"), "-auth", &a, "-nolisten", "tcp", "-screen", "0", &screen], &[])?;
        let d = Display { number, auth, dir, procs: Mutex::new(vec![x]), vnc: Mutex::new(None) };
        // Ready when a client is let in.
        let began = Instant::now();
        loop {
            if d.run("xdotool", &["getdisplaygeometry"], None).await.is_ok() {
                break;
            }
            if began.elapsed() > Duration::from_secs(10) {
                return Err(format!("the X display :{number} did not come up in 10 s"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Openbox with a configuration of our own: focus and moving windows,
        // no menus and no key bindings (its default root menu starts a
        // terminal, which would hand the agent the host).
        let rc = d.dir.join("openbox-rc.xml");
        let rc_s = rc.to_string_lossy().into_owned();
        if on_path("openbox").is_some()
            && std::fs::write(&rc, OPENBOX_RC).is_ok()
            && let Ok(wm) = spawn("openbox", &["--config-file", &rc_s], &d.env())
            && let Ok(mut p) = d.procs.lock()
        {
            p.push(wm);
        }
        Ok(d)
    }

    /// Run an X tool on this desktop; its stdout.
    pub async fn run(&self, program: &str, args: &[&str], stdin: Option<&[u8]>) -> Result<Vec<u8>, String> {
        use tokio::io::AsyncWriteExt;
        let mut c = tokio::process::Command::new(program);
        c.args(args)
            .env_clear()
            .envs(clean_env())
            .envs(self.env())
            .stdin(if stdin.is_some() { std::process::Stdio::piped() } else { std::process::Stdio::null() })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = c.spawn().map_err(|e| format!("cannot run {program}: {e}"))?;
        if let (Some(data), Some(mut w)) = (stdin, child.stdin.take()) {
            w.write_all(data).await.map_err(|e| e.to_string())?;
        }
        let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
            .await
            .map_err(|_| format!("{program} did not finish in 20 s"))?
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(out.stdout)
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            Err(format!("{program}: {}", err.lines().last().unwrap_or("failed").trim()))
        }
    }

    /// Put text on the clipboard: xclip stays in the background to serve
    /// it (and ends with the display), so its output is not waited for.
    pub async fn set_clipboard(&self, text: &str) -> Result<(), String> {
        use tokio::io::AsyncWriteExt;
        let mut c = tokio::process::Command::new("xclip");
        c.args(["-selection", "clipboard", "-i"])
            .env_clear()
            .envs(clean_env())
            .envs(self.env())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut child = c.spawn().map_err(|e| format!("cannot run xclip: {e}"))?;
        if let Some(mut w) = child.stdin.take() {
            w.write_all(text.as_bytes()).await.map_err(|e| e.to_string())?;
        }
        let st = tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .map_err(|_| "xclip did not take the text in 10 s".to_string())?
            .map_err(|e| e.to_string())?;
        if st.success() { Ok(()) } else { Err("xclip could not take the clipboard".into()) }
    }

    /// The screen as PNG.
    pub async fn screenshot(&self) -> Result<Vec<u8>, String> {
        let file = self.dir.join(format!("shot-{}.png", random_hex(4)));
        let f = file.to_string_lossy().into_owned();
        let r = self.run("scrot", &["-o", "-z", &f], None).await;
        let bytes = r.and_then(|_| std::fs::read(&file).map_err(|e| e.to_string()));
        let _ = std::fs::remove_file(&file);
        bytes
    }

    /// The VNC server the owner watches through (started on first ask).
    pub async fn vnc(&self) -> Result<Vnc, String> {
        if let Some(v) = self.vnc.lock().ok().and_then(|v| v.clone()) {
            return Ok(v);
        }
        on_path("x11vnc").ok_or("watching the desktop needs x11vnc (apt-get install x11vnc)")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let password = random_hex(4);
        let pw = self.dir.join("vncpasswd");
        std::fs::write(&pw, format!("{password}\n")).map_err(|e| e.to_string())?;
        let (p, a, disp) =
            (pw.to_string_lossy().into_owned(), self.auth.to_string_lossy().into_owned(), format!(":{}", self.number));
        let port_s = port.to_string();
        let child = spawn(
            "x11vnc",
            &[
                "-display",
                &disp,
                "-auth",
                &a,
                "-localhost",
                "-rfbport",
                &port_s,
                "-passwdfile",
                &p,
                "-forever",
                "-shared",
                "-quiet",
                "-nossl",
            ],
            &[],
        )?;
        let began = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            if began.elapsed() > Duration::from_secs(10) {
                return Err("the VNC server did not start in 10 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Ok(mut ps) = self.procs.lock() {
            ps.push(child);
        }
        let v = Vnc { port, password };
        if let Ok(mut slot) = self.vnc.lock() {
            *slot = Some(v.clone());
        }
        Ok(v)
    }

    /// The VNC server when one runs (no start).
    pub fn vnc_now(&self) -> Option<Vnc> {
        self.vnc.lock().ok().and_then(|v| v.clone())
    }

    /// How the owner watches it: a line to tell them.
    pub fn watch_hint(v: &Vnc) -> String {
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        format!(
            "VNC on 127.0.0.1:{port} (password {pw}); from another machine: ssh -L {port}:127.0.0.1:{port} {host}, then a VNC viewer on localhost:{port}",
            port = v.port,
            pw = v.password
        )
    }
}

impl Drop for Display {
    fn drop(&mut self) {
        if let Ok(mut ps) = self.procs.lock() {
            for p in ps.iter_mut().rev() {
                let _ = p.start_kill();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(format!("/tmp/.X{}-lock", self.number));
        let _ = std::fs::remove_file(format!("/tmp/.X11-unix/X{}", self.number));
    }
}

/// The agent's desktop, started on first use.
pub async fn ensure(agent_id: &str) -> Result<Arc<Display>, String> {
    if let Some(d) = get(agent_id) {
        return Ok(d);
    }
    let _g = STARTING.lock().await;
    if let Some(d) = get(agent_id) {
        return Ok(d);
    }
    let d = Arc::new(Display::start(agent_id).await?);
    if let Ok(mut m) = DISPLAYS.lock() {
        m.insert(agent_id.to_string(), d.clone());
    }
    Ok(d)
}

pub fn get(agent_id: &str) -> Option<Arc<Display>> {
    DISPLAYS.lock().ok()?.get(agent_id).cloned()
}

/// `DISPLAY` and `XAUTHORITY` of the agent's desktop, when it has one.
pub fn env_for(agent_id: &str) -> Vec<(String, String)> {
    get(agent_id).map(|d| d.env()).unwrap_or_default()
}

/// The agent stopped: its desktop and what runs on it go.
pub fn stop(agent_id: &str) {
    let d = DISPLAYS.lock().ok().and_then(|mut m| m.remove(agent_id));
    drop(d);
}

/// What `desktop` does (the tool): `{action, x, y, text, keys, button}`.
pub async fn act(d: &Display, input: &Value) -> Result<Value, String> {
    let action = input["action"].as_str().unwrap_or_default();
    let xy = || -> Result<(String, String), String> {
        let x = input["x"].as_i64().ok_or("x is required")?;
        let y = input["y"].as_i64().ok_or("y is required")?;
        if !(0..WIDTH as i64).contains(&x) || !(0..HEIGHT as i64).contains(&y) {
            return Err(format!("({x}, {y}) is off the {WIDTH}x{HEIGHT} screen"));
        }
        Ok((x.to_string(), y.to_string()))
    };
    let button = match input["button"].as_str().unwrap_or("left") {
        "left" => "1",
        "middle" => "2",
        "right" => "3",
        other => return Err(format!("button {other:?} is not left, middle or right")),
    };
    let out = input_action(d, input, action, button, xy).await?;
    // What was typed or clicked reaches the program behind the window a
    // moment after xdotool returns (the X server, then the program's own
    // event loop): wait that moment, so the next look (a screenshot, a
    // browser read) sees its effect.
    if matches!(action, "click" | "double_click" | "scroll" | "type" | "key") {
        tokio::time::sleep(SETTLE).await;
    }
    Ok(out)
}

/// How long input is given to land before the action returns.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

async fn input_action(
    d: &Display,
    input: &Value,
    action: &str,
    button: &str,
    xy: impl Fn() -> Result<(String, String), String>,
) -> Result<Value, String> {
    match action {
        "click" | "double_click" => {
            let (x, y) = xy()?;
            let repeat = if action == "double_click" { "2" } else { "1" };
            d.run("xdotool", &["mousemove", "--sync", &x, &y, "click", "--repeat", repeat, button], None).await?;
            Ok(json!({"ok": true, "action": action, "x": input["x"], "y": input["y"]}))
        }
        "move" => {
            let (x, y) = xy()?;
            d.run("xdotool", &["mousemove", "--sync", &x, &y], None).await?;
            Ok(json!({"ok": true, "action": "move"}))
        }
        "scroll" => {
            let down = input["direction"].as_str().unwrap_or("down") != "up";
            let n = input["amount"].as_u64().unwrap_or(3).clamp(1, 50).to_string();
            d.run("xdotool", &["click", "--repeat", &n, if down { "5" } else { "4" }], None).await?;
            Ok(json!({"ok": true, "action": "scroll"}))
        }
        "type" => {
            let text = input["text"].as_str().ok_or("text is required")?;
            if text.chars().count() > 10_000 {
                return Err("text is over 10,000 characters".into());
            }
            d.run("xdotool", &["type", "--delay", "2", "--", text], None).await?;
            Ok(json!({"ok": true, "action": "type", "characters": text.chars().count()}))
        }
        "key" => {
            let keys: Vec<&str> =
                input["keys"].as_str().ok_or("keys is required (e.g. \"ctrl+l Return\")")?.split_whitespace().collect();
            if keys.is_empty() || keys.len() > 50 {
                return Err("keys is one to 50 key names such as ctrl+l or Return".into());
            }
            for k in &keys {
                key_ok(k)?;
            }
            // One key an invocation: nothing after it could be read as a
            // command of xdotool's own.
            for k in keys {
                d.run("xdotool", &["key", "--", k], None).await?;
            }
            Ok(json!({"ok": true, "action": "key"}))
        }
        "clipboard_set" => {
            let text = input["text"].as_str().ok_or("text is required")?;
            d.set_clipboard(text).await?;
            Ok(json!({"ok": true, "action": "clipboard_set"}))
        }
        "clipboard_get" => {
            let out = d.run("xclip", &["-selection", "clipboard", "-o"], None).await.unwrap_or_default();
            Ok(json!({"text": String::from_utf8_lossy(&out)}))
        }
        "cursor" => {
            let out = d.run("xdotool", &["getmouselocation", "--shell"], None).await?;
            let s = String::from_utf8_lossy(&out);
            let get = |k: &str| s.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.parse::<i64>().ok());
            Ok(json!({"x": get("X="), "y": get("Y=")}))
        }
        "watch" => {
            let v = d.vnc().await?;
            Ok(json!({"vnc_port": v.port, "password": v.password, "how": Display::watch_hint(&v)}))
        }
        other => Err(format!(
            "unknown action {other:?} (screenshot, click, double_click, move, scroll, type, key, clipboard_set, clipboard_get, cursor, watch)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_key_names_never_xdotool_commands() {
        for ok in ["Return", "ctrl+l", "shift+Tab", "a", "F5", "ctrl+alt+Delete", "KP_Enter"] {
            assert!(key_ok(ok).is_ok(), "{ok}");
        }
        for bad in ["exec", "EXEC", "type", "windowkill", "a;b", "--sync", "", "ctrl+", "+a", "/bin/sh", "a b", "$(id)"]
        {
            assert!(key_ok(bad).is_err(), "{bad:?}");
        }
    }
}
