//! Where adf keeps things: the config folder (settings, keymaps, tokens) and
//! the data folder (the default fleet), from the platform's conventions via
//! `directories`, or under `$ADF_HOME` for tests and portable setups.

use std::path::PathBuf;

/// `$ADF_HOME/config`, else the platform config folder (`~/.config/adf`).
pub fn config_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("ADF_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(home).join("config");
    }
    directories::ProjectDirs::from("", "", "adf")
        .map(|d| d.config_dir().to_path_buf())
        .unwrap_or_else(|| PathBuf::from(".adf/config"))
}

/// `$ADF_HOME/data`, else the platform data folder (`~/.local/share/adf`).
pub fn data_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("ADF_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(home).join("data");
    }
    directories::ProjectDirs::from("", "", "adf")
        .map(|d| d.data_dir().to_path_buf())
        .unwrap_or_else(|| PathBuf::from(".adf/data"))
}

/// The default fleet folder: `<data>/agents`.
pub fn fleet_dir() -> PathBuf {
    data_dir().join("agents")
}
