//! Media a tool shows the model (runtime.md §2.1, §9.1; tools.md `fs_read`,
//! `adf_shell`): an image, a sound or a video that `fs_read` or the shell's
//! `cat` reached is sent to the model as a native block right after the
//! tool's result, when the agent's model takes that modality
//! (`model.multimodal`, or the older `model.vision`) and the file is under
//! its size limit. The blocks live in memory only: the loop row keeps the
//! text that names the file, and the transcript drops the bytes from older
//! messages. A provider that refuses images gets one retry without them.
//! A media body `sys_fetch` brings back is saved under `downloads/` and
//! named, never left in the context as base64.

use base64::Engine;
use serde_json::{Value, json};

use super::Executor;

/// Shell results attach at most this many files.
const MAX_SHELL_MEDIA: usize = 8;

/// Which modalities the agent's model takes, each with its size limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Modalities {
    pub image: Option<u64>,
    pub audio: Option<u64>,
    pub video: Option<u64>,
}

impl Modalities {
    pub fn of(cfg: &Value) -> Modalities {
        let on = |k: &str| cfg["model"]["multimodal"][k].as_bool();
        let limit = |k: &str, d: u64| cfg["limits"][format!("max_{k}_size_bytes").as_str()].as_u64().unwrap_or(d);
        let image = on("image").or_else(|| cfg["model"]["vision"].as_bool()).unwrap_or(false);
        Modalities {
            image: image.then(|| limit("image", 5_242_880)),
            audio: on("audio").unwrap_or(false).then(|| limit("audio", 10_485_760)),
            video: on("video").unwrap_or(false).then(|| limit("video", 20_971_520)),
        }
    }

    pub fn any(&self) -> bool {
        self.image.is_some() || self.audio.is_some() || self.video.is_some()
    }

    /// The names of the modalities taken, for the system prompt.
    pub fn names(&self) -> Vec<&'static str> {
        [("image", self.image), ("audio", self.audio), ("video", self.video)]
            .into_iter()
            .filter_map(|(n, l)| l.map(|_| n))
            .collect()
    }

    /// The native block for a file of this type and size, when taken.
    pub fn block(&self, mime: &str, bytes: &[u8]) -> Option<Value> {
        let size = bytes.len() as u64;
        let b64 = || base64::engine::general_purpose::STANDARD.encode(bytes);
        if is_vision_mime(mime) {
            let max = self.image?;
            return (size <= max)
                .then(|| json!({"type": "image_url", "image_url": {"url": format!("data:{mime};base64,{}", b64())}}));
        }
        if let Some(format) = audio_format(mime) {
            let max = self.audio?;
            return (size <= max)
                .then(|| json!({"type": "input_audio", "input_audio": {"data": b64(), "format": format}}));
        }
        if is_video_mime(mime) {
            let max = self.video?;
            return (size <= max)
                .then(|| json!({"type": "video_url", "video_url": {"url": format!("data:{mime};base64,{}", b64())}}));
        }
        None
    }
}

/// Image types both providers take.
pub fn is_vision_mime(mime: &str) -> bool {
    matches!(mime, "image/png" | "image/jpeg" | "image/gif" | "image/webp")
}

fn audio_format(mime: &str) -> Option<&'static str> {
    Some(match mime {
        "audio/wav" | "audio/x-wav" | "audio/wave" => "wav",
        "audio/mpeg" | "audio/mp3" => "mp3",
        "audio/aiff" => "aiff",
        "audio/aac" => "aac",
        "audio/ogg" => "ogg",
        "audio/flac" => "flac",
        "audio/x-m4a" => "m4a",
        "audio/webm" => "webm",
        _ => return None,
    })
}

fn is_video_mime(mime: &str) -> bool {
    matches!(mime, "video/mp4" | "video/mpeg" | "video/quicktime" | "video/webm")
}

/// The files a successful result points at: `fs_read` of a binary file, or
/// the `media` manifest of the shell and of `sys_fetch` (each path once, at
/// most eight).
pub fn referenced(tool: &str, content: &str) -> Vec<(String, String)> {
    if !matches!(tool, "fs_read" | "adf_shell" | "sys_fetch" | "browser" | "desktop") && !tool.starts_with("mcp_") {
        return Vec::new();
    }
    let Ok(v) = serde_json::from_str::<Value>(content) else { return Vec::new() };
    let pair = |e: &Value| Some((e["path"].as_str()?.to_string(), e["mime_type"].as_str()?.to_string()));
    if tool == "fs_read" {
        // Text comes back as text; only binary content (`null`) is media.
        return if v["content"].is_null() { pair(&v).into_iter().collect() } else { Vec::new() };
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for e in v["media"].as_array().into_iter().flatten() {
        if let Some(p) = pair(e)
            && !out.iter().any(|(q, _)| *q == p.0)
        {
            out.push(p);
        }
        if out.len() == MAX_SHELL_MEDIA {
            break;
        }
    }
    out
}

/// Where a fetched file is saved: `downloads/` and the URL's last path
/// segment (safe characters only), with an extension for its type.
fn download_name(url: &str, mime: &str) -> String {
    let seg = url::Url::parse(url)
        .ok()
        .and_then(|u| u.path_segments().and_then(|mut s| s.next_back().map(str::to_string)))
        .unwrap_or_default();
    let mut name: String =
        seg.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')).take(80).collect();
    name = name.trim_start_matches('.').to_string();
    if name.is_empty() {
        name = "fetched".into();
    }
    if !name.contains('.')
        && let Some(ext) = mime_guess::get_mime_extensions_str(mime).and_then(|e| e.first())
    {
        name = format!("{name}.{ext}");
    }
    format!("downloads/{name}")
}

impl Executor {
    /// Save base64 media as a file through `fs_write`, as the agent (its
    /// protections and limits apply); the error text when it was refused.
    pub(super) async fn save_media(
        &mut self,
        source: &str,
        path: &str,
        base64: &str,
        mime: &str,
    ) -> Result<(), String> {
        let cx = crate::runtime::code::CodeCx { authorized: false, source: source.into(), chain: Vec::new() };
        let write = json!({"mode": "write", "path": path, "content": base64, "encoding": "base64", "mime_type": mime});
        let w = Box::pin(self.code_tool(&cx, "fs_write", &write, false)).await;
        if w.is_error { Err(w.content) } else { Ok(()) }
    }

    /// A media body `sys_fetch` brought back to the loop is saved as a file
    /// (through `fs_write`, so the agent's own rules apply) and named in
    /// the result instead of sitting there as base64; the saved file then
    /// attaches like any other when the model takes it.
    pub(super) async fn keep_fetched_media(&mut self, input: &Value, out: &mut crate::tools::ToolOutput) {
        let Ok(mut v) = serde_json::from_str::<Value>(&out.content) else { return };
        if v["_body_encoding"] != "base64" {
            return;
        }
        let mime = v["headers"]["content-type"]
            .as_str()
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let Some(kind) = ["image", "audio", "video"].into_iter().find(|k| mime.starts_with(&format!("{k}/"))) else {
            return;
        };
        let Some(body) = v["body"].as_str().map(str::to_string) else { return };
        let size = body.len() / 4 * 3 - body.chars().rev().take_while(|c| *c == '=').count();
        let base = download_name(input["url"].as_str().unwrap_or(""), &mime);
        let mut path = base.clone();
        for n in 1..100 {
            if !matches!(self.store.file_stat(&path), Ok(Some(_))) {
                break;
            }
            path = match base.rsplit_once('.') {
                Some((stem, ext)) => format!("{stem}-{n}.{ext}"),
                None => format!("{base}-{n}"),
            };
        }
        let saved = self.save_media("sys_fetch", &path, &body, &mime).await;
        if let Some(o) = v.as_object_mut() {
            o.remove("_body_encoding");
        }
        if let Err(e) = saved {
            v["body"] = json!(format!("[{kind}: {mime}, {size} bytes, not shown; saving it failed: {e}]"));
        } else {
            v["body"] = json!(format!("[{kind}: {path} ({mime}, {size} bytes), saved from the response]"));
            v["media"] = json!([{"path": path, "mime_type": mime}]);
        }
        out.content = serde_json::to_string_pretty(&v).unwrap_or_else(|_| out.content.clone());
    }

    /// The native blocks for what one tool result showed (empty when the
    /// model takes none of it).
    pub(super) fn media_for(&self, cfg: &Value, tool: &str, content: &str) -> Vec<Value> {
        let m = Modalities::of(cfg);
        if !m.any() {
            return Vec::new();
        }
        referenced(tool, content)
            .into_iter()
            .filter_map(|(path, mime)| {
                // Check the size before reading the bytes.
                let entry = self.store.file_stat(&path).ok()??;
                let limit = if is_vision_mime(&mime) {
                    m.image
                } else if audio_format(&mime).is_some() {
                    m.audio
                } else {
                    m.video
                };
                if entry.size > limit? {
                    return None;
                }
                let (_, bytes) = self.store.file_read(&path).ok()?;
                m.block(&mime, &bytes)
            })
            .collect()
    }
}

/// The notice that replaces images a provider refused.
pub fn recovery_notice(error: &str) -> String {
    format!(
        "[System notice: The previous assistant turn failed because the provider could not process image content: \
         \"{}\". Image attachments have been removed from the conversation. The image may be corrupted, unsupported \
         by this model, or oversized. Reason about what happened and try another approach, for example inspect the \
         file with adf_shell or code instead of viewing it.]",
        clip(error)
    )
}

/// The notice when the retry without images failed too.
pub fn recovery_failed_notice(error: &str) -> String {
    format!(
        "[System notice: Recovery retry also failed: \"{}\". Stopping automatic image-error recovery. Reason about \
         what happened and try a different approach, or wait for new input.]",
        clip(error)
    )
}

fn clip(s: &str) -> String {
    s.chars().take(500).collect::<String>().replace(']', ")")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modalities_follow_config_and_the_old_vision_flag() {
        assert!(!Modalities::of(&json!({})).any());
        let m = Modalities::of(&json!({"model": {"vision": true}}));
        assert_eq!(m.image, Some(5_242_880));
        let m = Modalities::of(&json!({"model": {"vision": true, "multimodal": {"image": false, "audio": true}},
                                       "limits": {"max_audio_size_bytes": 10}}));
        assert_eq!((m.image, m.audio, m.video), (None, Some(10), None));
        assert_eq!(m.names(), ["audio"]);
    }

    #[test]
    fn blocks_by_type_and_size() {
        let m = Modalities { image: Some(4), audio: Some(4), video: None };
        let img = m.block("image/png", b"\x89PNG").unwrap();
        assert_eq!(img["image_url"]["url"], "data:image/png;base64,iVBORw==");
        assert!(m.block("image/png", b"12345").is_none(), "over the limit");
        assert!(m.block("image/svg+xml", b"<svg").is_none(), "not a type models take");
        assert_eq!(m.block("audio/mpeg", b"ID3").unwrap()["input_audio"]["format"], "mp3");
        assert!(m.block("video/mp4", b"mp4").is_none(), "video is off");
    }

    #[test]
    fn references_from_fs_read_and_the_shell() {
        let fs = json!({"path": "a.png", "mime_type": "image/png", "content": null}).to_string();
        assert_eq!(referenced("fs_read", &fs), vec![("a.png".to_string(), "image/png".to_string())]);
        let text = json!({"path": "a.md", "mime_type": "text/markdown", "content": "hi"}).to_string();
        assert!(referenced("fs_read", &text).is_empty());
        let media: Vec<Value> =
            (0..12).map(|i| json!({"path": format!("{}.png", i % 10), "mime_type": "image/png"})).collect();
        let sh = json!({"exit_code": 0, "stdout": "", "stderr": "", "media": media}).to_string();
        let refs = referenced("adf_shell", &sh);
        assert_eq!(refs.len(), 8);
        assert!(referenced("db_query", &sh).is_empty());
    }

    #[test]
    fn download_names_are_safe_and_typed() {
        assert_eq!(download_name("https://x.test/a/cat%20pic.png?x=1", "image/png"), "downloads/cat20pic.png");
        assert_eq!(download_name("https://x.test/", "image/jpeg").rsplit_once('.').unwrap().0, "downloads/fetched");
        assert_eq!(download_name("https://x.test/../..", "image/png").split('.').count(), 2);
        assert_eq!(download_name("not a url", "audio/mpeg").split('/').next(), Some("downloads"));
    }

    #[test]
    fn notices_cannot_close_their_frame_early() {
        let n = recovery_notice("bad ] image");
        assert!(n.starts_with("[System notice: ") && n.ends_with(".]"));
        assert_eq!(n.matches(']').count(), 1, "{n}");
    }
}
