//! `adf compute`: the install's side of real computers (issue 22). The
//! owner switches host commands on or off and approves the programs agents
//! may start (`compute.host`), picks the container engine
//! (`compute.engine`), builds the managed containers' image from Debian
//! packages, and registers external containers agents may be allowed
//! (`compute.external`), all in `settings.json`. An agent also needs its
//! own `compute` config. Bad input changes nothing.

use clap::Subcommand;
use serde_json::{Value, json};

use super::output::Out;
use crate::providers::accounts;
use crate::runtime::compute::{self, containers, image};

#[derive(Debug, Clone, Subcommand)]
pub enum ComputeCmd {
    /// What agents may run on this machine (the default).
    Status,
    /// Host commands: `on`, `off`, `allow PROGRAM…`, `deny PROGRAM…`.
    Host {
        #[command(subcommand)]
        cmd: HostCmd,
    },
    /// The container engine: podman, docker, a path to either, auto (the
    /// first that runs here) or none (no containers).
    Engine { name: String },
    /// The managed containers' image: `build` makes it from Debian packages.
    Image {
        #[command(subcommand)]
        cmd: ImageCmd,
    },
    /// External containers you run yourself: `add`, `rm`. adf runs commands
    /// in them for agents whose `compute.allowed_targets` names them, and
    /// never starts, stops or rebuilds them.
    External {
        #[command(subcommand)]
        cmd: ExternalCmd,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum HostCmd {
    /// Allow host commands for this install (agents still need their own
    /// `compute.host_access`).
    On,
    /// Refuse every host command.
    Off,
    /// Approve programs (names found on PATH, or exact absolute paths).
    Allow {
        #[arg(required = true)]
        programs: Vec<String>,
    },
    /// Withdraw approval of programs.
    Deny {
        #[arg(required = true)]
        programs: Vec<String>,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum ImageCmd {
    /// Build the image with mmdebstrap and the engine (a few minutes).
    Build,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ExternalCmd {
    /// Register a running container under an alias agents may be given.
    Add {
        /// The agent-facing name (lowercase letters, digits, dashes).
        alias: String,
        /// The container's name or id.
        #[arg(long)]
        container: String,
        /// podman or docker (the detected engine when absent).
        #[arg(long)]
        engine: Option<String>,
        /// The working folder for commands.
        #[arg(long)]
        workspace: Option<String>,
        /// The user commands run as.
        #[arg(long)]
        user: Option<String>,
    },
    /// Forget an external container (the container itself is left alone).
    Rm { alias: String },
}

/// A program name an owner may approve: a bare name, or an absolute path.
fn program_ok(p: &str) -> Result<(), String> {
    let bare = !p.is_empty() && !p.contains('/') && p != "." && p != "..";
    let path = p.starts_with('/')
        && std::path::Path::new(p).components().all(|c| !matches!(c, std::path::Component::ParentDir));
    let clean = !p.chars().any(|c| c.is_whitespace() || c.is_control() || "$`;&|<>(){}*?[]\\\"'~".contains(c));
    if (bare || path) && clean {
        Ok(())
    } else {
        Err(format!("{p:?} is not a program name (a bare name such as git, or an absolute path)"))
    }
}

/// An external target's alias: what `allowed_targets` may name.
fn alias_ok(a: &str) -> Result<(), String> {
    let ok = (1..=48).contains(&a.len())
        && a.starts_with(|c: char| c.is_ascii_lowercase())
        && a.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !matches!(a, "host" | "isolated" | "shared" | "vfs");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{a:?} is not an alias (lowercase letters, digits and dashes, a letter first, at most 48; not host, isolated, shared or vfs)"
        ))
    }
}

/// A container name as the engines take it.
fn container_ok(c: &str) -> Result<(), String> {
    let ok = !c.is_empty()
        && c.len() <= 128
        && c.starts_with(|ch: char| ch.is_ascii_alphanumeric())
        && c.chars().all(|ch| ch.is_ascii_alphanumeric() || "_.-".contains(ch));
    if ok { Ok(()) } else { Err(format!("{c:?} is not a container name or id")) }
}

/// Change `settings.json` `compute` with `f`; nothing is written when it fails.
fn edit(f: impl FnOnce(&mut Value) -> Result<(), String>) -> anyhow::Result<()> {
    let path = accounts::settings_path();
    let mut s = accounts::load().map_err(anyhow::Error::msg)?;
    let mut c = s.extra.get("compute").cloned().unwrap_or_else(|| json!({}));
    if !c.is_object() {
        anyhow::bail!("settings.json compute is not an object; {} unchanged", path.display());
    }
    f(&mut c).map_err(|e| anyhow::anyhow!("{e}; {} unchanged", path.display()))?;
    s.extra.insert("compute".into(), c);
    accounts::save(&s).map_err(anyhow::Error::msg)
}

fn host(c: &mut Value, cmd: &HostCmd) -> Result<(), String> {
    if let HostCmd::Allow { programs } | HostCmd::Deny { programs } = cmd {
        for p in programs {
            program_ok(p)?;
        }
    }
    let mut h = c["host"].clone();
    if !h.is_object() {
        h = json!({"enabled": false, "programs": []});
    }
    let mut programs: Vec<String> = h["programs"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    match cmd {
        HostCmd::On => h["enabled"] = json!(true),
        HostCmd::Off => h["enabled"] = json!(false),
        HostCmd::Allow { programs: add } => {
            for p in add {
                if !programs.contains(p) {
                    programs.push(p.clone());
                }
            }
        }
        HostCmd::Deny { programs: drop } => programs.retain(|p| !drop.contains(p)),
    }
    h["programs"] = json!(programs);
    c["host"] = h;
    Ok(())
}

fn external(c: &mut Value, cmd: &ExternalCmd) -> Result<(), String> {
    let mut list = c["external"].as_array().cloned().unwrap_or_default();
    match cmd {
        ExternalCmd::Add { alias, container, engine, workspace, user } => {
            alias_ok(alias)?;
            container_ok(container)?;
            if let Some(e) = engine
                && !matches!(e.as_str(), "podman" | "docker")
            {
                return Err(format!("--engine {e:?} is not podman or docker"));
            }
            if let Some(w) = workspace
                && !w.starts_with('/')
            {
                return Err(format!("--workspace {w:?} is not an absolute path in the container"));
            }
            if list.iter().any(|e| e["alias"] == alias.as_str()) {
                return Err(format!(
                    "an external container is already called {alias} (adf compute external rm {alias})"
                ));
            }
            let mut e = json!({"alias": alias, "container": container});
            for (k, v) in [("engine", engine), ("workspace", workspace), ("user", user)] {
                if let Some(v) = v {
                    e[k] = json!(v);
                }
            }
            list.push(e);
        }
        ExternalCmd::Rm { alias } => {
            let before = list.len();
            list.retain(|e| e["alias"] != alias.as_str());
            if list.len() == before {
                return Err(format!("no external container is called {alias}"));
            }
        }
    }
    c["external"] = json!(list);
    Ok(())
}

pub fn run(out: &Out, cmd: Option<&ComputeCmd>) -> anyhow::Result<()> {
    match cmd {
        Some(ComputeCmd::Host { cmd }) => edit(|c| host(c, cmd))?,
        Some(ComputeCmd::Engine { name }) => edit(|c| {
            match name.as_str() {
                "auto" => {
                    if let Some(o) = c.as_object_mut() {
                        o.remove("engine");
                    }
                }
                "podman" | "docker" | "none" => c["engine"] = json!(name),
                p if p.starts_with('/') => c["engine"] = json!(p),
                other => return Err(format!("{other:?} is not podman, docker, auto, none or an absolute path")),
            }
            Ok(())
        })?,
        Some(ComputeCmd::External { cmd }) => edit(|c| external(c, cmd))?,
        Some(ComputeCmd::Image { cmd: ImageCmd::Build }) => return build(out),
        Some(ComputeCmd::Status) | None => {}
    }
    status(out)
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

fn build(out: &Out) -> anyhow::Result<()> {
    let settings = compute::Settings::load();
    runtime()?.block_on(async {
        let engine = containers::engine_for(&settings).await.map_err(anyhow::Error::msg)?;
        let say = |l: &str| eprintln!("adf: {l}");
        let started = std::time::Instant::now();
        let tag = image::build(&engine, &say).await.map_err(anyhow::Error::msg)?;
        let secs = started.elapsed().as_secs();
        if out.json {
            return out.json(&json!({"image": tag, "engine": engine.name(), "seconds": secs}));
        }
        out.line(format!("built {tag} with {} in {secs} s", engine.name()))
    })
}

fn status(out: &Out) -> anyhow::Result<()> {
    let s = compute::Settings::load();
    let (engine, listed) = runtime()?.block_on(async {
        match containers::engine_for(&s).await {
            Ok(e) => {
                let image = s.image.clone().unwrap_or_else(image::tag);
                let built = e.image_exists(&image).await;
                let list = containers::get().list(&e).await.unwrap_or_default();
                (Ok((e, image, built)), list)
            }
            Err(e) => (Err(e), Vec::new()),
        }
    });
    let externals: Vec<Value> = s
        .external
        .iter()
        .map(|e| json!({"alias": e.alias, "container": e.container, "engine": e.engine, "workspace": e.workspace, "user": e.user}))
        .collect();
    if out.json {
        let engine_v = match &engine {
            Ok((e, image, built)) => json!({"name": e.name(), "version": e.version, "program": e.program,
                "runtime_args": e.global, "image": image, "image_built": built}),
            Err(why) => json!({"name": Value::Null, "error": why}),
        };
        return out.json(&json!({"host": {"enabled": s.host.enabled, "programs": s.host.programs},
            "settings": accounts::settings_path(), "engine": engine_v, "containers": listed, "external": externals}));
    }
    let p = &s.host;
    out.line(format!(
        "host commands: {} · approved programs: {}",
        if p.enabled { "on" } else { "off (adf compute host on)" },
        if p.programs.is_empty() { "none (adf compute host allow git …)".to_string() } else { p.programs.join(", ") }
    ))?;
    out.line(
        "an agent runs them only with its own compute.host_access (adf config set FILE compute.host_access true)",
    )?;
    match &engine {
        Ok((e, image, built)) => {
            out.line(format!(
                "containers: {} {} · image {image} {}",
                e.name(),
                e.version,
                if *built { "built" } else { "not built (adf compute image build)" }
            ))?;
            for c in &listed {
                out.line(format!(
                    "  {} {} {}",
                    c["name"].as_str().unwrap_or(""),
                    c["role"].as_str().unwrap_or(""),
                    c["state"].as_str().unwrap_or("")
                ))?;
            }
        }
        Err(why) => out.line(format!("containers: unavailable: {why}"))?,
    }
    for e in &s.external {
        out.line(format!("external {}: container {}", e.alias, e.container))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_program_names_are_approved() {
        for ok in ["git", "python3", "/usr/local/bin/tool", "cargo-nextest"] {
            assert!(program_ok(ok).is_ok(), "{ok}");
        }
        for bad in ["", "rm -rf", "a;b", "./x", "../x", "/usr/../bin/sh", "$(id)", "x*", "a/b"] {
            assert!(program_ok(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn external_aliases_and_names_are_checked() {
        for ok in ["py-tools", "dev2"] {
            assert!(alias_ok(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Py", "host", "shared", "-x", "a b", "a/b", &"x".repeat(49)] {
            assert!(alias_ok(bad).is_err(), "{bad:?}");
        }
        assert!(container_ok("my_dev.1").is_ok());
        for bad in ["", "-x", "a b", "a;b", "$(id)"] {
            assert!(container_ok(bad).is_err(), "{bad:?}");
        }
        let mut c = json!({});
        let add = |alias: &str| ExternalCmd::Add {
            alias: alias.into(),
            container: "dev".into(),
            engine: None,
            workspace: Some("/src".into()),
            user: None,
        };
        external(&mut c, &add("dev")).unwrap();
        assert!(external(&mut c, &add("dev")).unwrap_err().contains("already"));
        assert_eq!(c["external"], json!([{"alias": "dev", "container": "dev", "workspace": "/src"}]));
        external(&mut c, &ExternalCmd::Rm { alias: "dev".into() }).unwrap();
        assert!(external(&mut c, &ExternalCmd::Rm { alias: "dev".into() }).is_err());
    }
}
