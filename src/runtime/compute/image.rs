//! The managed containers' image, built on this machine from Debian
//! packages (no registry is assumed reachable): `mmdebstrap` makes a root
//! filesystem from the same mirror apt uses, and the engine imports it.
//! Python 3 with pip and `uv`, Node with npm, git and curl; the host's own
//! extra certificate authorities are trusted inside too (a machine behind a
//! TLS-inspecting proxy can still install packages); the `agent` user
//! (uid 1000) owns `/workspace`. The tag carries a digest of the recipe, so
//! a changed recipe is a new image and an old container keeps its own.

use std::time::Duration;

use sha2::Digest;

use super::engine::Engine;

/// The packages in the image.
pub const PACKAGES: &[&str] = &[
    "ca-certificates",
    "passwd",
    "procps",
    "coreutils",
    "tar",
    "python3",
    "python3-pip",
    "python3-venv",
    "nodejs",
    "npm",
    "git",
    "curl",
    "iproute2",
];

/// What runs in the new root filesystem after the packages (`$1` is it).
const HOOKS: &[&str] = &[
    "cp /usr/local/share/ca-certificates/*.crt \"$1/usr/local/share/ca-certificates/\" 2>/dev/null || true; chroot \"$1\" update-ca-certificates >/dev/null",
    "chroot \"$1\" python3 -m pip install --quiet --break-system-packages --no-cache-dir --no-warn-script-location uv",
    "chroot \"$1\" useradd --uid 1000 --home-dir /workspace --no-create-home --shell /bin/bash agent && mkdir -p \"$1/workspace\" && chown 1000:1000 \"$1/workspace\"",
    "rm -rf \"$1\"/var/cache/apt/archives/*.deb \"$1\"/var/lib/apt/lists/*",
];

/// The Debian release to build from: this machine's when it is Debian.
pub fn suite() -> String {
    let os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    let field = |k: &str| {
        os.lines().find_map(|l| l.strip_prefix(k).map(|v| v.trim_matches('"').to_string())).unwrap_or_default()
    };
    match (field("ID=").as_str(), field("VERSION_CODENAME=")) {
        ("debian", c) if !c.is_empty() => c,
        _ => "bookworm".into(),
    }
}

/// The image's tag for this recipe.
pub fn tag() -> String {
    let suite = suite();
    let mut h = sha2::Sha256::new();
    h.update(suite.as_bytes());
    for p in PACKAGES.iter().chain(HOOKS) {
        h.update(b"\0");
        h.update(p.as_bytes());
    }
    let d = crate::identity::hex(&h.finalize());
    format!("localhost/adf-compute:{suite}-{}", &d[..10])
}

/// Build the image (a few minutes); `say` hears what happens. The tag.
pub async fn build(engine: &Engine, say: &(dyn Fn(&str) + Sync)) -> Result<String, String> {
    let tag = tag();
    let mm = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("mmdebstrap")).find(|p| p.is_file()))
        .ok_or("mmdebstrap is not installed: it makes the image from Debian packages (apt-get install mmdebstrap)")?;
    let dir = crate::paths::data_dir().join("compute");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let tar = dir.join(format!(".rootfs-{}.tar", std::process::id()));
    let suite = suite();
    say(&format!("making a {suite} root filesystem with mmdebstrap (packages: {})", PACKAGES.join(", ")));
    let mut c = tokio::process::Command::new(mm);
    c.arg("--variant=minbase").arg(format!("--include={}", PACKAGES.join(",")));
    for h in HOOKS {
        c.arg(format!("--customize-hook={h}"));
    }
    c.arg(&suite).arg(&tar).stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).kill_on_drop(true);
    let status = tokio::time::timeout(Duration::from_secs(1800), c.status()).await;
    let made = match status {
        Ok(Ok(s)) if s.success() => Ok(()),
        Ok(Ok(s)) => Err(format!("mmdebstrap failed ({s}); what it printed says why")),
        Ok(Err(e)) => Err(format!("cannot run mmdebstrap: {e}")),
        Err(_) => Err("mmdebstrap took more than 30 minutes".into()),
    };
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tar);
        return Err(e);
    }
    say(&format!("importing it into {} as {tag}", engine.name()));
    let t = tar.to_string_lossy().into_owned();
    let r = engine
        .run(&["import", "--change", "WORKDIR /workspace", "--change", "USER root", &t, &tag], Duration::from_secs(900))
        .await;
    let _ = std::fs::remove_file(&tar);
    r?;
    Ok(tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_names_the_suite_and_the_recipe() {
        let t = tag();
        assert!(t.starts_with(&format!("localhost/adf-compute:{}-", suite())), "{t}");
        assert_eq!(t, tag(), "the same recipe is the same tag");
        assert_eq!(t.rsplit('-').next().map(str::len), Some(10));
    }
}
