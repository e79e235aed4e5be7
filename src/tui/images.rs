//! Pictures in the app: the compute panel draws the agent's newest
//! screenshot in the terminal. Where the terminal speaks a graphics
//! protocol (kitty, iTerm2, sixel) the picture is sent with it; anywhere
//! else, SSH and tmux included, it is drawn in coloured half blocks. The
//! protocols themselves are ratatui-image's; this file decides which one to
//! use (`ADF_IMAGES`), reads a PNG with limits (an agent writes its own
//! screenshots, so a hostile one must not take the app's memory), and
//! keeps the encoded picture until the area it is drawn in changes.

use std::cell::RefCell;

use image::DynamicImage;
use ratatui::layout::{Rect, Size};
use ratatui_image::Resize;
use ratatui_image::picker::cap_parser::QueryStdioOptions;
use ratatui_image::picker::{Picker, ProtocolType};
use ratatui_image::protocol::Protocol;

/// The largest picture read, in pixels a side and bytes of file.
const MAX_SIDE: u32 = 8192;
const MAX_FILE: usize = 32 << 20;
/// Pictures are kept at most this size: enough for a full-screen kitty
/// picture, small enough that a resize re-encodes quickly.
const KEEP_SIDE: u32 = 1600;

/// How pictures are drawn, from `ADF_IMAGES`: `off`, `blocks`, `kitty`,
/// `sixel`, `iterm2`, `query` (ask the terminal), or `auto` (the default:
/// ask a terminal known for graphics, half blocks elsewhere; nothing in
/// ASCII mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Off,
    Blocks,
    Forced(ProtocolType),
    Query,
    Auto,
}

impl Mode {
    pub fn parse(s: &str) -> Result<Mode, String> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Mode::Auto,
            "off" | "none" | "0" => Mode::Off,
            "blocks" | "halfblocks" => Mode::Blocks,
            "kitty" => Mode::Forced(ProtocolType::Kitty),
            "sixel" => Mode::Forced(ProtocolType::Sixel),
            "iterm2" | "iterm" => Mode::Forced(ProtocolType::Iterm2),
            "query" => Mode::Query,
            other => {
                return Err(format!("ADF_IMAGES={other}: expected auto, off, blocks, kitty, sixel, iterm2 or query"));
            }
        })
    }

    /// `ADF_IMAGES`, else auto; a value it cannot read is said once and
    /// taken as auto.
    pub fn from_env() -> (Mode, Option<String>) {
        match std::env::var("ADF_IMAGES") {
            Ok(v) => match Mode::parse(&v) {
                Ok(m) => (m, None),
                Err(e) => (Mode::Auto, Some(e)),
            },
            Err(_) => (Mode::Auto, None),
        }
    }
}

/// Whether the environment names a terminal that draws pictures (its
/// answer to the query is then worth the wait).
fn graphics_terminal(var: impl Fn(&str) -> Option<String>) -> bool {
    let set = |k: &str| var(k).is_some_and(|v| !v.is_empty());
    if ["KITTY_WINDOW_ID", "WEZTERM_EXECUTABLE", "ITERM_SESSION_ID", "GHOSTTY_RESOURCES_DIR", "KONSOLE_VERSION"]
        .iter()
        .any(|k| set(k))
    {
        return true;
    }
    let term = var("TERM").unwrap_or_default();
    if ["kitty", "foot", "mlterm", "contour", "wezterm", "ghostty", "rio"].iter().any(|t| term.contains(t)) {
        return true;
    }
    let program = var("TERM_PROGRAM").unwrap_or_default();
    ["iTerm.app", "WezTerm", "ghostty", "vscode", "mintty", "rio"].contains(&program.as_str())
}

/// The picker for this terminal. Call after raw mode and before the app
/// reads keys: a query writes to the terminal and reads its answer.
pub fn picker(mode: Mode, ascii: bool) -> Option<Picker> {
    // A terminal that draws pictures answers at once; one that does not
    // answer costs this wait at start, once.
    let options = || QueryStdioOptions { timeout: std::time::Duration::from_millis(500), ..Default::default() };
    let query = || Picker::from_query_stdio_with_options(options()).unwrap_or_else(|_| Picker::halfblocks());
    match mode {
        Mode::Off => None,
        Mode::Auto if ascii => None,
        Mode::Blocks => Some(Picker::halfblocks()),
        Mode::Query => Some(query()),
        Mode::Forced(p) => {
            let mut picker = query();
            picker.set_protocol_type(p);
            Some(picker)
        }
        Mode::Auto if graphics_terminal(|k| std::env::var(k).ok()) => Some(query()),
        Mode::Auto => Some(Picker::halfblocks()),
    }
}

/// A PNG read with limits, kept at most `KEEP_SIDE` a side.
pub fn decode(bytes: &[u8]) -> Result<DynamicImage, String> {
    if bytes.len() > MAX_FILE {
        return Err(format!("{} MB is over the {} MB the app draws", bytes.len() >> 20, MAX_FILE >> 20));
    }
    let mut reader = image::ImageReader::with_format(std::io::Cursor::new(bytes), image::ImageFormat::Png);
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(256 << 20);
    reader.limits(limits);
    let img = reader.decode().map_err(|e| match e {
        image::ImageError::Limits(_) => format!("larger than {MAX_SIDE}×{MAX_SIDE} pixels"),
        other => format!("not a PNG the app can read: {other}"),
    })?;
    Ok(if img.width() > KEEP_SIDE || img.height() > KEEP_SIDE {
        img.resize(KEEP_SIDE, KEEP_SIDE, image::imageops::FilterType::Triangle)
    } else {
        img
    })
}

/// The screenshot the panel shows: which file it came from, the picture or
/// why there is none, and its encoding for the last area it was drawn in.
pub struct Shot {
    /// The file's path and time: a new screenshot replaces this one.
    pub key: String,
    pub picture: Result<DynamicImage, String>,
    encoded: RefCell<Option<(Rect, Protocol)>>,
}

impl Shot {
    pub fn new(key: String, picture: Result<DynamicImage, String>) -> Shot {
        Shot { key, picture, encoded: RefCell::new(None) }
    }

    /// Draw it in `area`, encoding again only when the area changed.
    pub fn render(&self, picker: &Picker, area: Rect, buf: &mut ratatui::buffer::Buffer) {
        let Ok(img) = &self.picture else { return };
        if area.width == 0 || area.height == 0 {
            return;
        }
        let mut encoded = self.encoded.borrow_mut();
        if encoded.as_ref().is_none_or(|(at, _)| *at != area) {
            let size = Size::new(area.width, area.height);
            *encoded = picker.new_protocol(img.clone(), size, Resize::Scale(None)).ok().map(|p| (area, p));
        }
        if let Some((_, p)) = encoded.as_ref() {
            ratatui::widgets::Widget::render(ratatui_image::Image::new(p), area, buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 255 / w) as u8, (y * 255 / h) as u8, 200]));
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        out.into_inner()
    }

    #[test]
    fn modes_read_from_their_names_and_refuse_others() {
        assert_eq!(Mode::parse("").unwrap(), Mode::Auto);
        assert_eq!(Mode::parse("Kitty").unwrap(), Mode::Forced(ProtocolType::Kitty));
        assert_eq!(Mode::parse("blocks").unwrap(), Mode::Blocks);
        assert_eq!(Mode::parse("off").unwrap(), Mode::Off);
        let e = Mode::parse("jpeg").unwrap_err();
        assert!(e.contains("ADF_IMAGES=jpeg") && e.contains("kitty"), "{e}");
    }

    #[test]
    fn only_graphics_terminals_are_asked() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert!(graphics_terminal(env(&[("TERM", "xterm-kitty")])));
        assert!(graphics_terminal(env(&[("TERM_PROGRAM", "WezTerm")])));
        assert!(graphics_terminal(env(&[("KITTY_WINDOW_ID", "1"), ("TERM", "screen")])));
        assert!(!graphics_terminal(env(&[("TERM", "xterm-256color")])));
        assert!(!graphics_terminal(env(&[("TERM", "tmux-256color"), ("KITTY_WINDOW_ID", "")])));
    }

    #[test]
    fn ascii_and_off_draw_no_pictures() {
        assert!(picker(Mode::Off, false).is_none());
        assert!(picker(Mode::Auto, true).is_none());
        assert_eq!(picker(Mode::Blocks, true).unwrap().protocol_type(), ProtocolType::Halfblocks);
    }

    #[test]
    fn a_screenshot_is_read_and_kept_small() {
        let img = decode(&png(40, 20)).unwrap();
        assert_eq!((img.width(), img.height()), (40, 20));
        let big = decode(&png(3200, 100)).unwrap();
        assert_eq!(big.width(), KEEP_SIDE);
    }

    /// Hostile files: a PNG whose header claims 100,000 pixels a side
    /// (decoding it would take gigabytes), bytes that are no PNG, and an
    /// empty file are refused with the reason, never a panic.
    #[test]
    fn a_hostile_screenshot_is_refused_with_its_reason() {
        let mut bomb = png(1, 1);
        // IHDR's width and height follow the 8-byte signature, the
        // chunk's length and its type; its CRC then no longer matches, so
        // the decoder may refuse either way, but never allocate for it.
        bomb[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        bomb[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        assert!(decode(&bomb).is_err());
        let e = decode(b"GIF89a not a png").unwrap_err();
        assert!(e.contains("not a PNG"), "{e}");
        assert!(decode(&[]).is_err());
        let e = decode(&vec![0u8; MAX_FILE + 1]).unwrap_err();
        assert!(e.contains("over the 32 MB"), "{e}");
    }

    /// A well-formed PNG that is simply too large (CRC right) is refused by
    /// the limits, with the limit named.
    #[test]
    fn a_picture_past_the_limit_names_it() {
        let e = decode(&png(MAX_SIDE + 1, 1)).unwrap_err();
        assert!(e.contains("larger than 8192"), "{e}");
    }

    #[test]
    fn half_blocks_draw_the_picture_and_keep_its_encoding() {
        let shot = Shot::new("a".into(), decode(&png(40, 20)));
        let picker = Picker::halfblocks();
        let area = Rect::new(0, 0, 20, 5);
        let mut buf = ratatui::buffer::Buffer::empty(area);
        shot.render(&picker, area, &mut buf);
        let drawn: String = buf.content().iter().map(|c| c.symbol()).collect();
        assert!(drawn.contains('▀') || drawn.contains('▄'), "{drawn:?}");
        assert!(shot.encoded.borrow().as_ref().is_some_and(|(r, _)| *r == area));
    }
}
