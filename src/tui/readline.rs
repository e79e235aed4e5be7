//! Line editing as a shell's readline does it, for every one-line input of
//! the app (the palette's query, the `:` line, rejection feedback, the
//! fields of forms) and the same keys in the composer: `ctrl-a`/`home` and
//! `ctrl-e`/`end` go to the start and end, `ctrl-u` deletes to the start
//! (the whole line with the cursor at its end), `ctrl-k` to the end,
//! `ctrl-w` the word before the cursor, arrows and `ctrl-b`/`ctrl-f` move.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui_textarea::{CursorMove, TextArea};

/// A line of text and a cursor (in characters).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LineEdit {
    pub text: String,
    pub cursor: usize,
}

/// What a key did to a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edit {
    /// The text changed.
    Changed,
    /// Only the cursor moved.
    Moved,
    /// Not an editing key.
    Ignored,
}

impl LineEdit {
    /// A line holding `text`, the cursor at its end.
    pub fn new(text: &str) -> LineEdit {
        LineEdit { text: text.to_string(), cursor: text.chars().count() }
    }

    fn byte(&self, char_at: usize) -> usize {
        self.text.char_indices().nth(char_at).map(|(b, _)| b).unwrap_or(self.text.len())
    }

    fn len(&self) -> usize {
        self.text.chars().count()
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// The text before and after the cursor (for drawing it).
    pub fn split(&self) -> (&str, &str) {
        self.text.split_at(self.byte(self.cursor))
    }

    /// Apply one key.
    pub fn key(&mut self, ev: &KeyEvent) -> Edit {
        let ctrl = ev.modifiers.contains(KeyModifiers::CONTROL);
        let alt = ev.modifiers.contains(KeyModifiers::ALT);
        let n = self.len();
        match (ev.code, ctrl) {
            (KeyCode::Char('a'), true) | (KeyCode::Home, _) => self.cursor = 0,
            (KeyCode::Char('e'), true) | (KeyCode::End, _) => self.cursor = n,
            (KeyCode::Char('b'), true) | (KeyCode::Left, _) => self.cursor = self.cursor.saturating_sub(1),
            (KeyCode::Char('f'), true) | (KeyCode::Right, _) => self.cursor = (self.cursor + 1).min(n),
            (KeyCode::Char('u'), true) => {
                let at = self.byte(self.cursor);
                self.text.replace_range(..at, "");
                self.cursor = 0;
                return Edit::Changed;
            }
            (KeyCode::Char('k'), true) => {
                let at = self.byte(self.cursor);
                self.text.truncate(at);
                return Edit::Changed;
            }
            (KeyCode::Char('w'), true) => {
                let end = self.byte(self.cursor);
                let head = &self.text[..end];
                let word_end = head.trim_end().len();
                let start = head[..word_end].rfind(char::is_whitespace).map(|i| i + 1).unwrap_or(0);
                let removed = self.text[start..end].chars().count();
                self.text.replace_range(start..end, "");
                self.cursor -= removed;
                return Edit::Changed;
            }
            (KeyCode::Char('h'), true) | (KeyCode::Backspace, _) => {
                if self.cursor == 0 {
                    return Edit::Ignored;
                }
                let (a, b) = (self.byte(self.cursor - 1), self.byte(self.cursor));
                self.text.replace_range(a..b, "");
                self.cursor -= 1;
                return Edit::Changed;
            }
            (KeyCode::Char('d'), true) | (KeyCode::Delete, _) => {
                if self.cursor >= n {
                    return Edit::Ignored;
                }
                let (a, b) = (self.byte(self.cursor), self.byte(self.cursor + 1));
                self.text.replace_range(a..b, "");
                return Edit::Changed;
            }
            (KeyCode::Char(c), false) if !alt => {
                let at = self.byte(self.cursor);
                self.text.insert(at, c);
                self.cursor += 1;
                return Edit::Changed;
            }
            _ => return Edit::Ignored,
        }
        Edit::Moved
    }
}

/// The readline keys in the composer (a multi-line text area): `true` when
/// the key was one of them. `ctrl-u` and `ctrl-w` replace the text area's
/// own undo and word bindings so all inputs edit alike.
pub fn composer_key(ta: &mut TextArea<'static>, ev: &KeyEvent) -> bool {
    if !ev.modifiers.contains(KeyModifiers::CONTROL) {
        return false;
    }
    match ev.code {
        KeyCode::Char('a') => ta.move_cursor(CursorMove::Head),
        KeyCode::Char('e') => ta.move_cursor(CursorMove::End),
        KeyCode::Char('u') => {
            ta.delete_line_by_head();
        }
        KeyCode::Char('k') => {
            ta.delete_line_by_end();
        }
        KeyCode::Char('w') => {
            ta.delete_word();
        }
        _ => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }
    fn c(ch: char) -> KeyEvent {
        KeyEvent::new(KeyCode::Char(ch), KeyModifiers::CONTROL)
    }

    #[test]
    fn readline_keys_edit_a_line() {
        let mut l = LineEdit::new("approve once now");
        assert_eq!(l.key(&c('w')), Edit::Changed);
        assert_eq!(l.text, "approve once ");
        l.key(&c('w'));
        assert_eq!(l.text, "approve ");
        l.key(&c('a'));
        l.key(&k(KeyCode::Char('x')));
        assert_eq!((l.text.as_str(), l.cursor), ("xapprove ", 1));
        l.key(&c('e'));
        l.key(&k(KeyCode::Char('y')));
        assert_eq!(l.text, "xapprove y");
        l.key(&k(KeyCode::Left));
        l.key(&k(KeyCode::Backspace));
        assert_eq!(l.text, "xapprovey");
        assert_eq!(l.split(), ("xapprove", "y"));
        l.key(&c('u'));
        assert_eq!((l.text.as_str(), l.cursor), ("y", 0));
        l.key(&c('e'));
        l.key(&c('u'));
        assert!(l.is_empty(), "ctrl-u at the end clears the line");
        assert_eq!(l.key(&k(KeyCode::Backspace)), Edit::Ignored);
        let mut u = LineEdit::new("ünï cødé");
        u.key(&c('w'));
        assert_eq!((u.text.as_str(), u.cursor), ("ünï ", 4));
    }

    #[test]
    fn the_composer_edits_alike() {
        let mut ta = TextArea::from(vec!["hello big world".to_string()]);
        ta.move_cursor(CursorMove::End);
        assert!(composer_key(&mut ta, &c('w')));
        assert_eq!(ta.lines(), ["hello big "]);
        assert!(composer_key(&mut ta, &c('a')));
        ta.insert_char('>');
        assert!(composer_key(&mut ta, &c('e')));
        assert!(composer_key(&mut ta, &c('u')));
        assert_eq!(ta.lines(), [""]);
        assert!(!composer_key(&mut ta, &k(KeyCode::Char('u'))));
    }
}
