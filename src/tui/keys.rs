//! Key notation and keymaps. Bindings are data (`keymaps/default.toml`,
//! overridden entry by entry by `keymaps.toml` in the config folder), in
//! crossterm-style notation (`q`, `A`, `ctrl-p`, `shift-tab`, `alt-enter`).
//! A user file with an unknown section, key or command is an error that
//! names the file, the line and what was wrong.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::commands;

/// A key with its modifiers, normalised so that `A` and `shift-a` are one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub code: KeyCodeOrd,
    pub ctrl: bool,
    pub alt: bool,
    pub shift: bool,
}

/// The subset of key codes bindings use, orderable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyCodeOrd {
    Char(char),
    Enter,
    Esc,
    Tab,
    BackTab,
    Backspace,
    Delete,
    Up,
    Down,
    Left,
    Right,
    Home,
    End,
    PageUp,
    PageDown,
    F(u8),
}

const NAMED: &[(&str, KeyCodeOrd)] = &[
    ("enter", KeyCodeOrd::Enter),
    ("esc", KeyCodeOrd::Esc),
    ("tab", KeyCodeOrd::Tab),
    ("backtab", KeyCodeOrd::BackTab),
    ("backspace", KeyCodeOrd::Backspace),
    ("delete", KeyCodeOrd::Delete),
    ("up", KeyCodeOrd::Up),
    ("down", KeyCodeOrd::Down),
    ("left", KeyCodeOrd::Left),
    ("right", KeyCodeOrd::Right),
    ("home", KeyCodeOrd::Home),
    ("end", KeyCodeOrd::End),
    ("pageup", KeyCodeOrd::PageUp),
    ("pagedown", KeyCodeOrd::PageDown),
    ("space", KeyCodeOrd::Char(' ')),
];

impl Key {
    fn normalise(mut self) -> Self {
        match self.code {
            // Upper-case letters carry their shift; shifted symbols are
            // just the symbol.
            KeyCodeOrd::Char(_) => self.shift = false,
            KeyCodeOrd::Tab if self.shift => {
                self.code = KeyCodeOrd::BackTab;
                self.shift = false;
            }
            KeyCodeOrd::BackTab => self.shift = false,
            _ => {}
        }
        self
    }

    /// Parse notation: modifiers joined with `-` before the key.
    pub fn parse(s: &str) -> Result<Key, String> {
        if s.is_empty() {
            return Err("an empty key".into());
        }
        let (mods, last) = if s.len() > 1 && s.ends_with('-') {
            (&s[..s.len() - 1], "-")
        } else {
            match s.rsplit_once('-') {
                Some((m, k)) if !k.is_empty() => (m, k),
                _ => ("", s),
            }
        };
        let mut key = Key { code: KeyCodeOrd::Enter, ctrl: false, alt: false, shift: false };
        if !mods.is_empty() {
            for m in mods.trim_end_matches('-').split('-') {
                match m {
                    "ctrl" | "c" => key.ctrl = true,
                    "alt" | "a" | "meta" => key.alt = true,
                    "shift" | "s" => key.shift = true,
                    other => return Err(format!("unknown modifier \"{other}\" in \"{s}\"")),
                }
            }
        }
        let mut chars = last.chars();
        key.code = match (chars.next(), chars.next()) {
            (Some(c), None) => {
                if key.shift && c.is_ascii_lowercase() {
                    KeyCodeOrd::Char(c.to_ascii_uppercase())
                } else {
                    KeyCodeOrd::Char(c)
                }
            }
            _ => {
                let lower = last.to_ascii_lowercase();
                if let Some((_, c)) = NAMED.iter().find(|(n, _)| *n == lower) {
                    *c
                } else if let Some(n) = lower.strip_prefix('f').and_then(|n| n.parse::<u8>().ok()) {
                    KeyCodeOrd::F(n)
                } else {
                    return Err(format!("unknown key \"{last}\" in \"{s}\""));
                }
            }
        };
        Ok(key.normalise())
    }

    /// The key of a terminal event, or `None` for keys bindings never name.
    pub fn from_event(e: &KeyEvent) -> Option<Key> {
        let code = match e.code {
            KeyCode::Char(c) => KeyCodeOrd::Char(c),
            KeyCode::Enter => KeyCodeOrd::Enter,
            KeyCode::Esc => KeyCodeOrd::Esc,
            KeyCode::Tab => KeyCodeOrd::Tab,
            KeyCode::BackTab => KeyCodeOrd::BackTab,
            KeyCode::Backspace => KeyCodeOrd::Backspace,
            KeyCode::Delete => KeyCodeOrd::Delete,
            KeyCode::Up => KeyCodeOrd::Up,
            KeyCode::Down => KeyCodeOrd::Down,
            KeyCode::Left => KeyCodeOrd::Left,
            KeyCode::Right => KeyCodeOrd::Right,
            KeyCode::Home => KeyCodeOrd::Home,
            KeyCode::End => KeyCodeOrd::End,
            KeyCode::PageUp => KeyCodeOrd::PageUp,
            KeyCode::PageDown => KeyCodeOrd::PageDown,
            KeyCode::F(n) => KeyCodeOrd::F(n),
            _ => return None,
        };
        Some(
            Key {
                code,
                ctrl: e.modifiers.contains(KeyModifiers::CONTROL),
                alt: e.modifiers.contains(KeyModifiers::ALT),
                shift: e.modifiers.contains(KeyModifiers::SHIFT),
            }
            .normalise(),
        )
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ctrl {
            f.write_str("ctrl-")?;
        }
        if self.alt {
            f.write_str("alt-")?;
        }
        if self.shift {
            f.write_str("shift-")?;
        }
        match self.code {
            KeyCodeOrd::Char(' ') => f.write_str("space"),
            KeyCodeOrd::Char(c) => write!(f, "{c}"),
            KeyCodeOrd::BackTab => f.write_str("shift-tab"),
            KeyCodeOrd::F(n) => write!(f, "f{n}"),
            other => {
                let name = NAMED.iter().find(|(_, c)| *c == other).map(|(n, _)| *n).unwrap_or("?");
                f.write_str(name)
            }
        }
    }
}

/// Where a binding applies; looked up from the most specific outwards.
pub const CONTEXTS: &[&str] =
    &["global", "list", "agent", "composer", "files", "events", "mcp", "skills", "approvals", "logs", "grants"];

/// Bindings per context.
#[derive(Debug, Clone, Default)]
pub struct Keymap {
    pub maps: BTreeMap<String, BTreeMap<Key, String>>,
}

/// The shipped bindings.
pub const DEFAULT: &str = include_str!("../../keymaps/default.toml");

impl Keymap {
    /// The default keymap, then the user's file if there is one.
    pub fn load(user: Option<&Path>) -> Result<Keymap, String> {
        let mut km = Keymap::default();
        km.merge(DEFAULT, "keymaps/default.toml")?;
        if let Some(p) = user.filter(|p| p.exists()) {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            km.merge(&text, &p.display().to_string())?;
            km.check_exits(&p.display().to_string())?;
        }
        Ok(km)
    }

    /// A keymap must leave a way out of the app: a key for `quit`, or for
    /// the `:` line or the palette (where `quit` can be typed), anywhere
    /// but in the overlays.
    pub fn check_exits(&self, name: &str) -> Result<(), String> {
        let exits = ["quit", "command_line", "palette"];
        let ok = self
            .maps
            .iter()
            .filter(|(ctx, _)| !matches!(ctx.as_str(), "composer" | "palette" | "command_line" | "help"))
            .any(|(_, m)| m.values().any(|c| exits.contains(&c.as_str())));
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{name}: this keymap leaves no way to quit: no key is bound to quit, command_line or palette; \
                 keep one (e.g. \"q\" = \"quit\" under [global])"
            ))
        }
    }

    /// Add the bindings of one file; entries override earlier ones.
    pub fn merge(&mut self, text: &str, name: &str) -> Result<(), String> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e.span().map(|s| text[..s.start].lines().count().max(1)).unwrap_or(1);
            format!("{name}:{line}: {}", e.message())
        })?;
        self.merge_table(&table, text, name)
    }

    fn merge_table(&mut self, table: &toml::Table, text: &str, name: &str) -> Result<(), String> {
        for (section, v) in table {
            let at = |key: Option<&str>| line_of(text, section, key);
            // `"Q" = "quit"` outside any section is a [global] binding.
            if let Some(cmd) = v.as_str() {
                let one: toml::Table = [(section.clone(), toml::Value::String(cmd.to_string()))].into_iter().collect();
                let mut wrapped = toml::Table::new();
                wrapped.insert("global".into(), toml::Value::Table(one));
                self.merge_table(&wrapped, text, name)?;
                continue;
            }
            if !CONTEXTS.contains(&section.as_str()) {
                return Err(format!(
                    "{name}:{}: unknown section [{section}] (known: {})",
                    at(None),
                    CONTEXTS.join(", ")
                ));
            }
            let Some(entries) = v.as_table() else {
                return Err(format!("{name}:{}: [{section}] must be a table of \"key\" = \"command\"", at(None)));
            };
            let map = self.maps.entry(section.clone()).or_default();
            for (k, cmd) in entries {
                let line = at(Some(k));
                let key = Key::parse(k).map_err(|e| format!("{name}:{line}: {e}"))?;
                let Some(cmd) = cmd.as_str() else {
                    return Err(format!("{name}:{line}: the command for \"{k}\" must be a string"));
                };
                if cmd.is_empty() || cmd == "none" {
                    map.remove(&key);
                    continue;
                }
                if commands::find(cmd).is_none() {
                    let hint = commands::closest(cmd).map(|c| format!(" (did you mean \"{c}\"?)")).unwrap_or_default();
                    return Err(format!("{name}:{line}: unknown command \"{cmd}\" for key \"{k}\"{hint}"));
                }
                map.insert(key, cmd.to_string());
            }
        }
        Ok(())
    }

    /// The command bound to `key` in the first of `contexts` that has one.
    pub fn lookup(&self, contexts: &[&str], key: &Key) -> Option<&str> {
        contexts.iter().find_map(|c| self.maps.get(*c).and_then(|m| m.get(key))).map(String::as_str)
    }

    /// The keys bound to a command, in notation, across contexts.
    pub fn keys_for(&self, command: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for m in self.maps.values() {
            for (k, c) in m {
                let s = k.to_string();
                if c == command && !out.contains(&s) {
                    out.push(s);
                }
            }
        }
        out
    }
}

/// The 1-based line of `[section]` (key `None`) or of a key in it.
fn line_of(text: &str, section: &str, key: Option<&str>) -> usize {
    let mut current = String::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if let Some(s) = t.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            current = s.trim().to_string();
            if key.is_none() && current == section {
                return i + 1;
            }
            continue;
        }
        if let Some(k) = key
            && current == section
        {
            let quoted = format!("\"{k}\"");
            let bare = t.split('=').next().map(str::trim).unwrap_or("");
            if bare == quoted || bare == k || bare == format!("'{k}'") {
                return i + 1;
            }
        }
    }
    1
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn notation() {
        let k = Key::parse("ctrl-p").unwrap();
        assert!(k.ctrl && k.code == KeyCodeOrd::Char('p'));
        assert_eq!(Key::parse("shift-tab").unwrap().code, KeyCodeOrd::BackTab);
        assert_eq!(Key::parse("A").unwrap(), Key::parse("shift-a").unwrap());
        assert_eq!(Key::parse("-").unwrap().code, KeyCodeOrd::Char('-'));
        assert_eq!(Key::parse("alt--").unwrap().code, KeyCodeOrd::Char('-'));
        assert!(Key::parse("hyper-x").is_err());
        assert!(Key::parse("ctrl-bogus").is_err());
        let ev = KeyEvent::new(KeyCode::Char('A'), KeyModifiers::SHIFT);
        assert_eq!(Key::from_event(&ev), Some(Key::parse("A").unwrap()));
        let ev = KeyEvent::new(KeyCode::BackTab, KeyModifiers::SHIFT);
        assert_eq!(Key::from_event(&ev), Some(Key::parse("shift-tab").unwrap()));
    }

    #[test]
    fn default_keymap_loads_and_user_files_are_checked() {
        let km = Keymap::load(None).unwrap();
        assert_eq!(km.lookup(&["global"], &Key::parse("q").unwrap()), Some("quit"));
        assert_eq!(km.lookup(&["agent", "global"], &Key::parse("A").unwrap()), Some("approve_always"));
        let mut km2 = km.clone();
        let e = km2.merge("[global]\n\"q\" = \"quit\"\n\"x\" = \"qiut\"\n", "keymaps.toml").unwrap_err();
        assert_eq!(e, "keymaps.toml:3: unknown command \"qiut\" for key \"x\" (did you mean \"quit\"?)");
        let e = km2.merge("\n[globl]\n\"q\" = \"quit\"\n", "k.toml").unwrap_err();
        assert!(e.starts_with("k.toml:2: unknown section [globl]"), "{e}");
        let e = km2.merge("[global]\n\"ctrl-zz\" = \"quit\"\n", "k.toml").unwrap_err();
        assert!(e.starts_with("k.toml:2: unknown key \"zz\""), "{e}");
        let e = km2.merge("[global\n", "k.toml").unwrap_err();
        assert!(e.starts_with("k.toml:1:"), "{e}");
        // An override replaces one entry and keeps the rest.
        km2.merge("[global]\n\"Q\" = \"quit\"\n\"q\" = \"none\"\n", "k.toml").unwrap();
        assert_eq!(km2.lookup(&["global"], &Key::parse("q").unwrap()), None);
        assert_eq!(km2.lookup(&["global"], &Key::parse("Q").unwrap()), Some("quit"));
        assert_eq!(km2.lookup(&["global"], &Key::parse("?").unwrap()), Some("help"));
    }

    /// The README's example, as written (entries outside any section are
    /// [global] ones), loads from a user file; a keymap that unbinds every
    /// way out of the app is refused at load, naming the file.
    #[test]
    fn the_readme_example_works_and_no_keymap_locks_the_owner_in() {
        let dir = tempfile::tempdir().unwrap();
        let readme = include_str!("../../README.md");
        let example = readme
            .split("```toml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("the README shows a keymaps.toml in a toml block");
        let user = dir.path().join("keymaps.toml");
        std::fs::write(&user, example).unwrap();
        let km = Keymap::load(Some(&user)).unwrap();
        assert_eq!(km.lookup(&["global"], &Key::parse("Q").unwrap()), Some("quit"));
        assert_eq!(km.lookup(&["global"], &Key::parse("q").unwrap()), None);
        std::fs::write(&user, "\"Q\" = \"quit\"\n\"q\" = \"none\"\n").unwrap();
        assert!(Keymap::load(Some(&user)).is_ok(), "top-level entries are [global] ones");
        std::fs::write(&user, "[global]\n\"q\" = \"none\"\n\":\" = \"none\"\n\"ctrl-p\" = \"none\"\n").unwrap();
        let e = Keymap::load(Some(&user)).unwrap_err();
        assert!(e.starts_with(&user.display().to_string()) && e.contains("no way to quit"), "{e}");
        // One way out is enough.
        std::fs::write(&user, "[global]\n\"q\" = \"none\"\n\"ctrl-p\" = \"none\"\n").unwrap();
        assert!(Keymap::load(Some(&user)).is_ok(), "the : line still quits");
    }

    fn key_strategy() -> impl Strategy<Value = Key> {
        let code = prop_oneof![
            proptest::char::range('!', '~').prop_map(KeyCodeOrd::Char),
            proptest::sample::select(NAMED.iter().map(|(_, c)| *c).collect::<Vec<_>>()),
            (1u8..=12).prop_map(KeyCodeOrd::F),
        ];
        (code, any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(code, ctrl, alt, shift)| Key { code, ctrl, alt, shift }.normalise())
    }

    proptest! {
        #[test]
        fn notation_round_trips(k in key_strategy()) {
            prop_assert_eq!(Key::parse(&k.to_string()).unwrap(), k);
        }
    }
}
