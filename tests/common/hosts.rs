//! Test hosts on one machine (issue 23): Linux network namespaces, each
//! with an address of its own on a private bridge the test makes (in the
//! tailnet range, 100.64/10, as Tailscale hands out), torn down when the
//! `Lan` is dropped. Traffic stays on the bridge and in the namespaces.
//! Needs root and iproute2; `Lan::new` says why when it cannot be made.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub struct Lan {
    /// Short unique tag in every name this `Lan` made.
    tag: String,
    /// The /24's prefix: `100.X.Y`.
    pub prefix: String,
    pub hosts: Vec<String>,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).stdin(Stdio::null()).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl Lan {
    /// A bridge at `<prefix>.1` (the test's own side) and `n` hosts at
    /// `<prefix>.2`, `<prefix>.3`, …
    pub fn new(n: usize) -> Result<Lan, String> {
        let k = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let tag = format!("{:x}{k}", pid % 0xffff);
        let prefix = format!("100.{}.{}", 64 + (pid % 60), 10 + (k % 240));
        let mut lan = Lan { tag: tag.clone(), prefix: prefix.clone(), hosts: Vec::new() };
        let br = format!("adfb{tag}");
        ip(&["link", "add", &br, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{prefix}.1/24"), "dev", &br])?;
        ip(&["link", "set", &br, "up"])?;
        for i in 0..n {
            let ns = format!("adf{tag}h{i}");
            let (outer, inner) = (format!("adf{tag}o{i}"), format!("adf{tag}i{i}"));
            ip(&["netns", "add", &ns])?;
            lan.hosts.push(ns.clone());
            ip(&["link", "add", &outer, "type", "veth", "peer", "name", &inner])?;
            ip(&["link", "set", &inner, "netns", &ns])?;
            ip(&["link", "set", &outer, "master", &br])?;
            ip(&["link", "set", &outer, "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{prefix}.{}/24", i + 2), "dev", &inner])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(lan)
    }

    /// Plug host `i`'s wire in or out (its end on the bridge): its
    /// processes keep running, nothing reaches them.
    pub fn link(&self, i: usize, up: bool) -> Result<(), String> {
        ip(&["link", "set", &format!("adf{}o{i}", self.tag), if up { "up" } else { "down" }])
    }

    /// `program args…` inside host `i` as it is (no host name of its own).
    pub fn inside(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[i], program]);
        c
    }

    /// The address of host `i`.
    pub fn addr(&self, i: usize) -> String {
        format!("{}.{}", self.prefix, i + 2)
    }

    /// An address on the bridge no host has.
    pub fn nobody(&self) -> String {
        format!("{}.250", self.prefix)
    }

    /// The address of the test's own side of the bridge.
    pub fn gateway(&self) -> String {
        format!("{}.1", self.prefix)
    }

    /// `program args…` inside host `i`, under a host name of its own
    /// (`adf-host-<i>`, in a UTS namespace of its own: mDNS announces it).
    pub fn command(&self, i: usize, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[i], "unshare", "--uts", "--", "sh", "-c"])
            .arg(r#"hostname "$1" && shift && exec "$@""#)
            .args(["sh", &format!("adf-host-{i}")])
            .arg(program);
        c
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        // Deleting a namespace takes its end of each veth pair with it.
        for ns in &self.hosts {
            let _ = ip(&["netns", "del", ns]);
        }
        let _ = ip(&["link", "del", &format!("adfb{}", self.tag)]);
    }
}
