//! `adf token new|ls|rm`: tokens with a role for people and programs that
//! attach to the daemon (`daemon::roles`). The token is printed once, as
//! the last word of the output; only its hash is kept.

use super::output::Out;
use crate::daemon::roles::{self, Role};

#[derive(Debug, Clone, clap::Subcommand)]
pub enum TokenCmd {
    /// Mint a token: owner, approver (read, answer approvals and asks) or
    /// observer (read only). Printed once, as the last word.
    New {
        #[arg(long, value_parser = parse_role)]
        role: Role,
        /// What it is for ("phone", "ci").
        #[arg(long, default_value = "")]
        label: String,
    },
    /// The minted tokens (ids, roles, labels; never the tokens).
    Ls,
    /// Revoke a token by id: the daemon refuses it from the next request.
    Rm { id: String },
}

fn parse_role(s: &str) -> Result<Role, String> {
    Role::parse(s)
}

pub fn run(out: &Out, cmd: &TokenCmd) -> anyhow::Result<()> {
    match cmd {
        TokenCmd::New { role, label } => {
            let (m, token) = roles::mint(*role, label).map_err(anyhow::Error::msg)?;
            if out.json {
                return out.json(&serde_json::json!({"id": m.id, "role": m.role, "label": m.label, "token": token}));
            }
            out.line(format!(
                "{} token {} minted{}; send it as Authorization: Bearer (or ADF_DAEMON_TOKEN). It is shown once: {token}",
                m.role.as_str(),
                m.id,
                if m.label.is_empty() { String::new() } else { format!(" for {}", m.label) },
            ))
        }
        TokenCmd::Ls => {
            let list = roles::list().map_err(anyhow::Error::msg)?;
            if out.json {
                let v: Vec<_> = list
                    .iter()
                    .map(|t| serde_json::json!({"id": t.id, "role": t.role, "label": t.label, "created_at": t.created_at}))
                    .collect();
                return out.json(&v);
            }
            if list.is_empty() {
                return out.line("no minted tokens (the install's own token is the owner's)");
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|t| vec![t.id.clone(), t.role.as_str().into(), t.label.clone(), t.created_at.clone()])
                .collect();
            out.table(&["ID", "ROLE", "LABEL", "CREATED"], &rows)
        }
        TokenCmd::Rm { id } => {
            if !roles::remove(id).map_err(anyhow::Error::msg)? {
                anyhow::bail!("no token {id} (adf token ls lists them)");
            }
            if out.json {
                out.json(&serde_json::json!({"id": id, "removed": true}))
            } else {
                out.line(format!("token {id} revoked"))
            }
        }
    }
}
