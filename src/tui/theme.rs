//! Themes: semantic roles (`text`, `accent`, `waiting`, …) mapped to
//! styles, from `themes/*.toml`. The default uses the terminal's 16 ANSI
//! colours so it follows the user's palette over SSH. A theme file with an
//! unknown role, colour or attribute is an error naming file and line.

use std::path::Path;

use ratatui::style::{Color, Modifier, Style};

/// The roles every theme defines (a missing one falls back to the default's).
pub const ROLES: &[&str] = &[
    "text",
    "dim",
    "accent",
    "focus_border",
    "border",
    "selection",
    "running",
    "waiting",
    "error",
    "off",
    "user",
    "assistant",
    "reasoning",
    "tool",
];

/// The themes shipped in the binary.
pub const BUILTIN: &[(&str, &str)] = &[
    ("default", include_str!("../../themes/default.toml")),
    ("dark", include_str!("../../themes/dark.toml")),
    ("light", include_str!("../../themes/light.toml")),
    ("high-contrast", include_str!("../../themes/high-contrast.toml")),
    ("mono", include_str!("../../themes/mono.toml")),
];

#[derive(Debug, Clone)]
pub struct Theme {
    pub name: String,
    styles: [Style; 14],
}

impl Theme {
    /// A style by role; roles are checked when the theme loads.
    pub fn get(&self, role: &str) -> Style {
        ROLES.iter().position(|r| *r == role).map(|i| self.styles[i]).unwrap_or_default()
    }

    /// A built-in theme by name, or a file path.
    pub fn load(name_or_path: &str) -> Result<Theme, String> {
        let base = parse(BUILTIN[0].1, "themes/default.toml", None)?;
        if let Some((_, text)) = BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            return parse(text, &format!("themes/{name_or_path}.toml"), Some(&base));
        }
        let p = Path::new(name_or_path);
        let text = std::fs::read_to_string(p).map_err(|e| {
            let known: Vec<&str> = BUILTIN.iter().map(|(n, _)| *n).collect();
            format!("theme \"{name_or_path}\": {e} (built-in themes: {})", known.join(", "))
        })?;
        parse(&text, &p.display().to_string(), Some(&base))
    }

    pub fn default_theme() -> Theme {
        // The shipped file is checked by a unit test.
        parse(BUILTIN[0].1, "themes/default.toml", None)
            .unwrap_or(Theme { name: "default".into(), styles: [Style::default(); 14] })
    }
}

fn line_of(text: &str, key: &str) -> usize {
    text.lines().position(|l| l.trim_start().starts_with(key) && l.contains('=')).map(|i| i + 1).unwrap_or(1)
}

fn color(s: &str) -> Option<Color> {
    Some(match s {
        "reset" | "default" => Color::Reset,
        "black" => Color::Black,
        "red" => Color::Red,
        "green" => Color::Green,
        "yellow" => Color::Yellow,
        "blue" => Color::Blue,
        "magenta" => Color::Magenta,
        "cyan" => Color::Cyan,
        "gray" | "grey" => Color::Gray,
        "dark_gray" | "dark_grey" => Color::DarkGray,
        "light_red" => Color::LightRed,
        "light_green" => Color::LightGreen,
        "light_yellow" => Color::LightYellow,
        "light_blue" => Color::LightBlue,
        "light_magenta" => Color::LightMagenta,
        "light_cyan" => Color::LightCyan,
        "white" => Color::White,
        hex if hex.starts_with('#') && hex.len() == 7 => {
            let v = u32::from_str_radix(&hex[1..], 16).ok()?;
            Color::Rgb((v >> 16) as u8, (v >> 8) as u8, v as u8)
        }
        _ => return None,
    })
}

fn parse(text: &str, file: &str, base: Option<&Theme>) -> Result<Theme, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let line = e.span().map(|s| text[..s.start].lines().count().max(1)).unwrap_or(1);
        format!("{file}:{line}: {}", e.message())
    })?;
    let mut theme = base.cloned().unwrap_or(Theme { name: String::new(), styles: [Style::default(); 14] });
    theme.name = table.get("name").and_then(|v| v.as_str()).unwrap_or(file).to_string();
    for key in table.keys() {
        if key != "name" && key != "roles" {
            return Err(format!("{file}:{}: unknown key \"{key}\" (a theme has name and [roles])", line_of(text, key)));
        }
    }
    let Some(roles) = table.get("roles").and_then(|v| v.as_table()) else {
        return Err(format!("{file}:1: a theme needs a [roles] table"));
    };
    for (role, v) in roles {
        let line = line_of(text, role);
        let Some(i) = ROLES.iter().position(|r| r == role) else {
            return Err(format!("{file}:{line}: unknown role \"{role}\" (roles: {})", ROLES.join(", ")));
        };
        let bad_color = |c: &str| format!("{file}:{line}: unknown colour \"{c}\" for {role}");
        let style = match v {
            toml::Value::String(c) => Style::default().fg(color(c).ok_or_else(|| bad_color(c))?),
            toml::Value::Table(t) => {
                let mut st = Style::default();
                for (k, v) in t {
                    match (k.as_str(), v) {
                        ("fg", toml::Value::String(c)) => st = st.fg(color(c).ok_or_else(|| bad_color(c))?),
                        ("bg", toml::Value::String(c)) => st = st.bg(color(c).ok_or_else(|| bad_color(c))?),
                        ("bold", toml::Value::Boolean(true)) => st = st.add_modifier(Modifier::BOLD),
                        ("italic", toml::Value::Boolean(true)) => st = st.add_modifier(Modifier::ITALIC),
                        ("underline", toml::Value::Boolean(true)) => st = st.add_modifier(Modifier::UNDERLINED),
                        ("reverse", toml::Value::Boolean(true)) => st = st.add_modifier(Modifier::REVERSED),
                        ("bold" | "italic" | "underline" | "reverse", toml::Value::Boolean(false)) => {}
                        _ => {
                            return Err(format!(
                                "{file}:{line}: unknown attribute \"{k}\" for {role} (fg, bg, bold, italic, underline, reverse)"
                            ));
                        }
                    }
                }
                st
            }
            _ => return Err(format!("{file}:{line}: {role} must be a colour name or a table")),
        };
        theme.styles[i] = style;
    }
    Ok(theme)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_themes_load_and_define_every_role() {
        for (name, text) in BUILTIN {
            let t = parse(text, name, None).unwrap();
            let defined: toml::Table = text.parse().unwrap();
            for r in ROLES {
                assert!(defined["roles"].get(*r).is_some(), "{name} lacks {r}");
            }
            assert_eq!(&t.name, name);
        }
        assert_eq!(Theme::load("light").unwrap().get("accent").fg, Some(Color::Blue));
    }

    #[test]
    fn typos_name_file_and_line() {
        let e = parse("name = \"x\"\n[roles]\ntext = \"reset\"\naccnet = \"cyan\"\n", "my.toml", None).unwrap_err();
        assert!(e.starts_with("my.toml:4: unknown role \"accnet\""), "{e}");
        let e = parse("[roles]\ntext = \"cyna\"\n", "my.toml", None).unwrap_err();
        assert_eq!(e, "my.toml:2: unknown colour \"cyna\" for text");
        let e = parse("[roles]\ntext = { fg = \"red\", blink = true }\n", "my.toml", None).unwrap_err();
        assert!(e.starts_with("my.toml:2: unknown attribute \"blink\""), "{e}");
        assert!(Theme::load("no-such-theme").unwrap_err().contains("built-in themes: default, dark"));
    }
}
