//! Every command of the terminal app, declared once: its name (what keymaps
//! and `:` use), aliases and description. The palette, the `:` line, `?`
//! help and the key hints on the bottom line are all generated from here
//! and the keymap.

pub struct CommandDef {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub description: &'static str,
    /// Offered in the palette and on the `:` line (movement and composer
    /// editing keys are not).
    pub palette: bool,
}

const fn c(name: &'static str, aliases: &'static [&'static str], description: &'static str) -> CommandDef {
    CommandDef { name, aliases, description, palette: true }
}

const fn k(name: &'static str, description: &'static str) -> CommandDef {
    CommandDef { name, aliases: &[], description, palette: false }
}

/// Commands that change an agent, its files or the fleet: the owner's
/// alone. An attached app with a lesser token hides them (the daemon
/// refuses them anyway).
const OWNER_ONLY: &[&str] = &[
    "new_agent",
    "rename",
    "edit_config",
    "unlock",
    "claim",
    "start",
    "stop",
    "idle",
    "hibernate",
    "interrupt",
    "emergency_stop",
    "approve_always",
    "grant",
    "grant_revoke",
    "channel_add",
    "edit_file",
    "edit_mind",
    "connect",
    "skill_toggle_mute",
    "side_loop",
    "mcp_add",
    "mcp_restart",
    "mcp_remove",
    "mcp_toggle_enabled",
    "mcp_toggle_restricted",
    "mcp_toggle_visible",
];

/// Answering approvals and asks: approvers and the owner.
const ANSWERS: &[&str] =
    &["approve_once", "reject", "focus_composer", "compose_in_editor", "send", "newline", "leave_composer"];

/// May a token of `role` run `name` in the app?
pub fn allowed(role: crate::daemon::roles::Role, name: &str) -> bool {
    use crate::daemon::roles::Role;
    match role {
        Role::Owner => true,
        Role::Approver => !OWNER_ONLY.contains(&name),
        Role::Observer => !OWNER_ONLY.contains(&name) && !ANSWERS.contains(&name),
    }
}

pub const ALL: &[CommandDef] = &[
    c("quit", &["q", "exit"], "Quit the app (agents of an attached daemon keep running)"),
    c("help", &["keys"], "Show the keys active now"),
    c("command_line", &[], "Run a command by name"),
    c("palette", &[], "Find a command"),
    c("agents", &["fleet", "tree"], "Show the fleet tree and the selected agent's chat"),
    c("approvals", &["attention", "waiting"], "Everything waiting for you across the fleet, oldest first"),
    c("events", &["log"], "Show or hide the events pane"),
    c("files", &["fs"], "Browse the selected agent's files"),
    c("inbox", &["messages", "mail"], "The selected agent's inbox: who wrote, verified and encrypted marks"),
    c("chat", &[], "Show the selected agent's chat"),
    c("new_agent", &["new"], "Create an agent: name, provider, model (:new NAME fills the name)"),
    c("rename", &[], "Rename the selected agent (:rename NAME; its file keeps its name)"),
    c("edit_config", &["config"], "Edit the selected agent's config JSON in $EDITOR (checked before saving)"),
    c("unlock", &[], "Open the selected agent's credentials with their password"),
    c("claim", &[], "Re-key the selected agent (owned by someone else) to you: a new DID"),
    c("start", &[], "Start the selected agent (lift a suspension)"),
    c("stop", &["off"], "Turn the selected agent off"),
    c("idle", &[], "Set the selected agent to idle"),
    c("hibernate", &[], "Set the selected agent to hibernate"),
    c("interrupt", &["abort"], "Interrupt the selected agent's turn"),
    c("emergency_stop", &["panic", "estop"], "Turn every agent off now"),
    c("approve_once", &["approve"], "Approve the selected request once"),
    c("approve_always", &["always"], "Approve and lift the gate for this tool on this agent"),
    c("reject", &["deny"], "Reject the selected request with feedback"),
    c("mark", &["select"], "Mark the selected approval for a batch: a and r then answer every marked one"),
    c("group_by", &["group"], "Group the approvals queue by tool, by agent, or not at all"),
    c(
        "grant",
        &[],
        "Approve the selected (or marked) requests and grant their tool ahead of time: :grant 30m | path DIR | host H",
    ),
    c("edit_file", &["edit"], "Edit the selected file in $EDITOR"),
    c("edit_mind", &["mind"], "Edit mind.md in $EDITOR"),
    c("focus_composer", &["write"], "Write a message to the selected agent"),
    c("compose_in_editor", &[], "Write the message in $EDITOR"),
    c("follow", &["pause"], "Pause or follow the events pane"),
    c("events_scope", &["scope"], "Events of the selected agent only, or of the whole fleet"),
    c("filter", &[], "Filter the events pane, or find in the focused list"),
    c("connect", &["provider", "key"], "Connect a model provider: type its key (saved 0600)"),
    c("skills", &[], "The selected agent's skills: the fleet's and its own, muted, invalid with the reason"),
    c("skill_toggle_mute", &["mute"], "Mute or unmute the selected skill (its files stay)"),
    c(
        "burn",
        &["hot", "leaderboard"],
        "The hottest agents: tokens a minute, ten minutes as a sparkline, their budgets",
    ),
    c("why", &["stuck"], "Why the selected agent is awake or stuck: what woke it, what it waits on, its next wake"),
    c("logs", &["tasks"], "The selected agent's logs (t: its tasks); enter opens a row's payload"),
    c(
        "grants",
        &[],
        "The selected agent's grants: restricted tools approved ahead of time, until when, how often used",
    ),
    c(
        "channels",
        &["adapters"],
        "The selected agent's channels (Telegram, …): state, account, messages in and out, last error",
    ),
    c(
        "channel_add",
        &["connect_channel"],
        "Connect a channel for the selected agent: :channel_add telegram|slack|discord (then its token(s)) or :channel_add email ADDRESS [IMAP_URL [SMTP_URL]] (then its password), typed masked; :channel_add whatsapp NUMBER…|all shows the QR code to scan",
    ),
    c(
        "compute",
        &["computer", "browser", "desktop"],
        "Where the selected agent's commands run, its browser and desktop (the VNC address to watch), its last commands and exit codes, its newest screenshot",
    ),
    c("grant_revoke", &[], "In the grants view: revoke the selected grant"),
    c("toggle_tasks", &[], "In the logs panel: switch between logs and tasks"),
    c("context", &["ctx", "gauge"], "How full the selected loop's context window is, and what takes the space"),
    c(
        "side_loop",
        &["loop", "loops"],
        "Side loops: :loop TEMPLATE [NAME] makes one; :loop pause|resume|rm the selected",
    ),
    c("next_loop", &[], "Show the selected agent's next loop (main, then its side loops)"),
    c("previous_loop", &[], "Show the selected agent's previous loop"),
    c("mcp", &["mcp_servers"], "The selected agent's MCP servers: status, tools and their flags, stderr"),
    c("mcp_add", &[], "Add an MCP server: :mcp_add npm:PKG | pypi:PKG | URL | COMMAND ARGS… [as NAME]"),
    c("mcp_restart", &[], "Connect the selected MCP server again"),
    c("mcp_remove", &[], "Remove the selected MCP server, its tools and credentials"),
    c("mcp_toggle_enabled", &[], "Turn the selected MCP tool on or off"),
    c("mcp_toggle_restricted", &[], "Make the selected MCP tool ask you first, or allow it"),
    c("mcp_toggle_visible", &[], "Show or hide the selected MCP tool from the model"),
    k("next_pane", "Focus the next pane"),
    k("previous_pane", "Focus the previous pane"),
    k("back", "Go back or close"),
    k("down", "Move down"),
    k("up", "Move up"),
    k("page_down", "Scroll a page down"),
    k("page_up", "Scroll a page up"),
    k("top", "Go to the top"),
    k("bottom", "Go to the bottom"),
    k("open", "Open the selection (expand a tool card, a folder, a file)"),
    k("send", "Send the message"),
    k("newline", "Insert a new line"),
    k("leave_composer", "Leave the composer"),
];

/// A command by name or alias.
pub fn find(name: &str) -> Option<&'static CommandDef> {
    ALL.iter().find(|c| c.name == name || c.aliases.contains(&name))
}

/// The command whose name is closest to a misspelt one (for error hints).
pub fn closest(name: &str) -> Option<&'static str> {
    ALL.iter().map(|c| (distance(name, c.name), c.name)).filter(|(d, _)| *d <= 3).min().map(|(_, n)| n)
}

fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found_by_alias() {
        let mut seen = std::collections::HashSet::new();
        for c in ALL {
            assert!(seen.insert(c.name), "{}", c.name);
            for a in c.aliases {
                assert!(seen.insert(a), "{a}");
            }
        }
        assert_eq!(find("q").unwrap().name, "quit");
        assert_eq!(find("approvals").unwrap().name, "approvals");
        assert_eq!(closest("qiut"), Some("quit"));
        assert_eq!(closest("zzzzzzzz"), None);
    }
}
