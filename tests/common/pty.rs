//! The real `adf` binary in a real pseudo-terminal (portable-pty), its
//! screen read back through a terminal emulator (vt100); terminal queries
//! (the cursor position) answered as a terminal would.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portable_pty::{CommandBuilder, PtySize, native_pty_system};

pub struct Tui {
    pub parser: Arc<Mutex<vt100::Parser>>,
    pub raw: Arc<Mutex<Vec<u8>>>,
    pub writer: Arc<Mutex<Box<dyn Write + Send>>>,
    pub child: Box<dyn portable_pty::Child + Send + Sync>,
    pub master: Box<dyn portable_pty::MasterPty + Send>,
}

impl Tui {
    pub fn start(home: &Path, base: &str, editor: Option<&Path>, cols: u16, rows: u16) -> Tui {
        let editor = editor.map(|e| e.display().to_string()).unwrap_or_else(|| "false".into());
        let env = [("ANTHROPIC_API_KEY", "sk-test"), ("ANTHROPIC_BASE_URL", base), ("EDITOR", editor.as_str())];
        Tui::start_with(home, &env, &[], cols, rows)
    }

    pub fn start_with(home: &Path, env: &[(&str, &str)], args: &[&str], cols: u16, rows: u16) -> Tui {
        let pty = native_pty_system();
        let pair = pty.openpty(PtySize { rows, cols, pixel_width: 0, pixel_height: 0 }).unwrap();
        let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_adf"));
        cmd.args(args);
        for k in ["VISUAL", "EDITOR", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENROUTER_API_KEY", "OLLAMA_HOST"] {
            cmd.env_remove(k);
        }
        cmd.env("ADF_HOME", home);
        cmd.env("LANG", "C.UTF-8");
        cmd.env("TERM", "xterm");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.cwd(home);
        let child = pair.slave.spawn_command(cmd).unwrap();
        drop(pair.slave);
        let parser = Arc::new(Mutex::new(vt100::Parser::new(rows, cols, 0)));
        let raw = Arc::new(Mutex::new(Vec::new()));
        let mut reader = pair.master.try_clone_reader().unwrap();
        let writer = Arc::new(Mutex::new(pair.master.take_writer().unwrap()));
        let (p, r, w) = (parser.clone(), raw.clone(), writer.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut parser = p.lock().unwrap();
                parser.process(&buf[..n]);
                r.lock().unwrap().extend_from_slice(&buf[..n]);
                // Answer cursor-position queries as a real terminal does.
                if buf[..n].windows(4).any(|x| x == b"\x1b[6n") {
                    let (row, col) = parser.screen().cursor_position();
                    let _ = write!(w.lock().unwrap(), "\x1b[{};{}R", row + 1, col + 1);
                }
            }
        });
        Tui { parser, raw, writer, child, master: pair.master }
    }

    pub fn screen(&self) -> String {
        self.parser.lock().unwrap().screen().contents()
    }

    /// The cells whose background is a true colour, as (row, column,
    /// colour): a picture drawn in half blocks.
    pub fn rgb_cells(&self) -> Vec<(u16, u16, (u8, u8, u8))> {
        let parser = self.parser.lock().unwrap();
        let screen = parser.screen();
        let (rows, cols) = screen.size();
        let mut out = Vec::new();
        for r in 0..rows {
            for c in 0..cols {
                if let Some(vt100::Color::Rgb(red, green, blue)) = screen.cell(r, c).map(|x| x.bgcolor()) {
                    out.push((r, c, (red, green, blue)));
                }
            }
        }
        out
    }

    pub fn wait_for(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.screen();
            if s.contains(text) {
                return s;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {text:?}; screen:\n{s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn wait_gone(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.screen();
            if !s.contains(text) {
                return s;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {text:?} to go; screen:\n{s}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn send(&mut self, bytes: &str) {
        let mut w = self.writer.lock().unwrap();
        w.write_all(bytes.as_bytes()).unwrap();
        w.flush().unwrap();
        drop(w);
        // Keys typed by a person arrive apart; give the app a beat.
        std::thread::sleep(Duration::from_millis(60));
    }

    pub fn raw(&self) -> String {
        String::from_utf8_lossy(&self.raw.lock().unwrap()).to_string()
    }

    pub fn quit(mut self) -> Vec<u8> {
        self.send("q");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "adf exited with {status:?}");
                break;
            }
            assert!(Instant::now() < deadline, "adf did not quit; screen:\n{}", self.screen());
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(200));
        assert!(!self.parser.lock().unwrap().screen().alternate_screen(), "the alternate screen was left");
        self.raw.lock().unwrap().clone()
    }
}
