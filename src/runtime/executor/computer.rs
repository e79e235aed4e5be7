//! `browser` and `desktop` (issue 22) in the executor: the agent's managed
//! Chromium and its X desktop (`runtime/compute/browser.rs`, `display.rs`),
//! both only for an agent with `compute.enabled`. Screenshots are saved in
//! the agent's files (`screenshots/`) through `fs_write`, so its own rules
//! apply, and named in a `media` manifest the model receives as an image
//! when it takes images. Closing the browser seals its profile into the
//! agent's credentials; a file copied elsewhere restores it there.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use super::Executor;
use crate::runtime::compute::{browser, display};
use crate::tools::ToolOutput;

fn needs_compute(cfg: &Value, what: &str) -> Option<ToolOutput> {
    (cfg["compute"]["enabled"] != true).then(|| {
        ToolOutput::err(format!(
            "the {what} needs compute.enabled for this agent (the owner sets it: adf config set FILE compute.enabled true)"
        ))
    })
}

impl Executor {
    pub(crate) async fn computer_tool(&mut self, name: &str, input: &Value) -> ToolOutput {
        let cfg = match self.store.config_value() {
            Ok(c) => c,
            Err(e) => return ToolOutput::err(e.to_string()),
        };
        let r = match name {
            "browser" => match needs_compute(&cfg, "browser") {
                Some(e) => return e,
                None => self.browser(&cfg, input).await,
            },
            "desktop" => match needs_compute(&cfg, "desktop") {
                Some(e) => return e,
                None => self.desktop(&cfg, input).await,
            },
            _ => Err(format!("Unknown tool: {name}")),
        };
        match r {
            Ok(v) => ToolOutput::json(&v),
            Err(e) => {
                let _ = self.log("warn", "compute", name, &e);
                ToolOutput::err(format!("{name} error: {e}"))
            }
        }
    }

    /// A desktop for a visible browser: only when the agent has not asked
    /// for a headless one and this machine can run it.
    fn wants_display(cfg: &Value) -> bool {
        cfg["compute"]["browser"] != false && display::missing().is_empty()
    }

    async fn browser(&mut self, cfg: &Value, input: &Value) -> Result<Value, String> {
        let action = input["action"].as_str().unwrap_or_default();
        let me = self.agent_id().to_string();
        if action == "close" {
            return match browser::close(&me).await? {
                None => Ok(json!({"closed": false, "note": "the browser was not open"})),
                Some(archive) => {
                    let n = archive.len();
                    self.store.secret_set(browser::PROFILE_SECRET, &archive, false).map_err(|e| {
                        format!(
                            "closed, but the profile could not be sealed ({e}); the owner may need to unlock the file"
                        )
                    })?;
                    let _ = self.log("info", "compute", "browser", &format!("closed; profile sealed ({n} bytes)"));
                    Ok(json!({"closed": true, "profile_sealed_bytes": n}))
                }
            };
        }
        let opts = browser::Options {
            allow_local: cfg["security"]["allow_local_fetch"].as_bool().unwrap_or(false),
            visible: Self::wants_display(cfg),
            resolver: self.resolver.clone(),
        };
        let env = if opts.visible { display::ensure(&me).await?.env() } else { Vec::new() };
        let sealed = match browser::get(&me) {
            Some(_) => None,
            None => self.store.secret_get(browser::PROFILE_SECRET).ok().flatten(),
        };
        let (s, restored) = browser::ensure(&me, &opts, sealed, env).await?;
        if restored {
            let _ = self.log("info", "compute", "browser", "profile restored from the agent's credentials");
        }
        let timeout = Duration::from_millis(input["timeout_ms"].as_u64().unwrap_or(15_000).clamp(100, 120_000));
        let selector = input["selector"].as_str().filter(|s| !s.is_empty());
        let need = || selector.ok_or_else(|| format!("{action} needs a selector (a CSS selector)"));
        let mut v = match action {
            "open" => {
                let url = input["url"].as_str().ok_or("open needs a url")?;
                s.open(url, timeout, &opts).await?
            }
            "click" => s.click(need()?).await?,
            "type" => {
                let text = input["text"].as_str().ok_or("type needs text")?;
                s.type_into(need()?, text, input["submit"] == true).await?
            }
            "read" => s.read(selector).await?,
            "back" => s.back().await?,
            "screenshot" => {
                let png = s.screenshot(input["full_page"] == true).await?;
                self.keep_screenshot("browser", &png).await?
            }
            "takeover" => {
                if !s.visible {
                    return Err(
                        "the browser runs headless here (compute.browser is false, or no Xvfb): nothing to take over"
                            .into(),
                    );
                }
                let d = display::ensure(&me).await?;
                let vnc = d.vnc().await?;
                let how = display::Display::watch_hint(&vnc);
                let _ = self.log(
                    "info",
                    "compute",
                    "takeover",
                    &format!("the owner may take over the browser: VNC port {}", vnc.port),
                );
                self.emit(
                    "browser.takeover",
                    "system:compute",
                    json!({"vnc_port": vnc.port, "reason": input["reason"]}),
                );
                json!({"vnc_port": vnc.port, "password": vnc.password, "how": how,
                    "next": "Ask your owner (the ask tool) to log in through this VNC session and to tell you when they are done; do not ask for their password."})
            }
            other => {
                return Err(format!(
                    "unknown action {other:?} (open, click, type, read, screenshot, back, takeover, close)"
                ));
            }
        };
        let blocked = s.take_blocked();
        if !blocked.is_empty() {
            let _ = self.log("warn", "compute", "browser_blocked", &blocked.join("; "));
            v["blocked"] = json!(blocked);
        }
        Ok(v)
    }

    async fn desktop(&mut self, _cfg: &Value, input: &Value) -> Result<Value, String> {
        let me = self.agent_id().to_string();
        let d = display::ensure(&me).await?;
        if input["action"] == "screenshot" {
            let png = d.screenshot().await?;
            return self.keep_screenshot("desktop", &png).await;
        }
        display::act(&d, input).await
    }

    /// Save a screenshot in the agent's files and name it for the model.
    async fn keep_screenshot(&mut self, what: &str, png: &[u8]) -> Result<Value, String> {
        let path = format!("screenshots/{what}-{}.png", crate::store::now_ms());
        let b64 = base64::engine::general_purpose::STANDARD.encode(png);
        self.save_media(what, &path, &b64, "image/png").await?;
        let (w, h) = png_size(png).unwrap_or((0, 0));
        Ok(json!({"path": path, "width": w, "height": h, "bytes": png.len(),
            "media": [{"path": path, "mime_type": "image/png"}]}))
    }
}

/// Width and height from a PNG's header.
fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    if png.len() < 24 || &png[..8] != b"\x89PNG\r\n\x1a\n" {
        return None;
    }
    let be = |i: usize| u32::from_be_bytes([png[i], png[i + 1], png[i + 2], png[i + 3]]);
    Some((be(16), be(20)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn png_sizes_are_read_from_the_header() {
        let mut p = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        p.extend(640u32.to_be_bytes());
        p.extend(480u32.to_be_bytes());
        assert_eq!(super::png_size(&p), Some((640, 480)));
        assert_eq!(super::png_size(b"GIF89a"), None);
    }
}
