//! Where adf keeps things: the config folder (settings, keymaps, tokens) and
//! the data folder (the default fleet), from the platform's conventions via
//! `directories`, or under `$ADF_HOME` for tests and portable setups.

use std::path::{Path, PathBuf};

use directories::ProjectDirs;

/// `$ADF_HOME/<sub>` when set, else the platform folder that `pick` chooses.
fn folder(sub: &str, pick: fn(&ProjectDirs) -> &Path) -> PathBuf {
    if let Some(home) = std::env::var_os("ADF_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(home).join(sub);
    }
    ProjectDirs::from("", "", "adf").map(|d| pick(&d).to_path_buf()).unwrap_or_else(|| Path::new(".adf").join(sub))
}

/// `$ADF_HOME/config`, else the platform config folder (`~/.config/adf`).
pub fn config_dir() -> PathBuf {
    folder("config", ProjectDirs::config_dir)
}

/// `$ADF_HOME/data`, else the platform data folder (`~/.local/share/adf`).
pub fn data_dir() -> PathBuf {
    folder("data", ProjectDirs::data_dir)
}

/// The default fleet folder: `<data>/agents`.
pub fn fleet_dir() -> PathBuf {
    data_dir().join("agents")
}
