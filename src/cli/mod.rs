//! The command line: argument definitions (clap) and dispatch. Every command
//! prints for people by default and JSON with `--json`; errors come back to
//! `main` as one line naming the file and the cause.

mod adapters;
mod bench;
mod bench_check;
pub mod bench_spawn;
mod chat;
mod clone;
mod compute;
mod config;
mod files;
mod fleet;
mod grants;
mod held;
mod identity;
mod inspect;
mod logs;
mod loops;
mod mcp;
mod meta;
mod moves;
mod msg;
mod output;
mod peers;
mod remote;
mod remotes;
mod repair;
mod scenario;
mod skills;
mod sql;
mod token;
mod usage;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub use fleet::{ensure_fleet, scan};
pub use output::Out;

/// Run and manage AI agents that each live in one .adf file.
#[derive(Debug, Parser)]
#[command(name = "adf", version, about, propagate_version = true)]
pub struct Cli {
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// The daemon to talk to (daemon commands; default: the one running
    /// for the fleet, else http://127.0.0.1:7385).
    #[arg(long, short = 'u', global = true, env = "ADF_DAEMON_URL")]
    pub url: Option<String>,
    /// A daemon of `adf remote ls` by name, with its token (repeatable, or
    /// `all`: `adf agents` then lists every host's agents).
    #[arg(long, global = true, value_name = "NAME")]
    pub remote: Vec<String>,
    /// Terminal app: draw below the prompt instead of on the alternate screen.
    #[arg(long)]
    pub inline: bool,
    /// Terminal app: a theme (default, dark, light, high-contrast) or a theme file.
    #[arg(long)]
    pub theme: Option<String>,
    /// Terminal app: ASCII glyphs even where the locale is UTF-8.
    #[arg(long)]
    pub ascii: bool,
    /// Terminal app: run the fleet in a background daemon (started when
    /// none runs; also `"daemon": true` in settings.json) and attach to it,
    /// so closing the terminal never stops the agents.
    #[arg(long)]
    pub daemon: bool,
    /// Terminal app: folders and agent files to open instead of the default
    /// fleet (as `adf daemon` takes them).
    #[arg(value_name = "DIR|FILE.adf")]
    pub paths: Vec<PathBuf>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum MsgCmd {
    /// Check an ALF message stored as JSON: the sender's DID, the message
    /// and payload signatures. Exit status 1 when any check fails.
    Verify { file: PathBuf },
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Create a new agent file.
    New {
        /// Where to create it (e.g. agents/scout.adf).
        path: PathBuf,
        /// Display name (default: the file name).
        #[arg(long)]
        name: Option<String>,
        /// Mesh handle, [a-z0-9-] (default: derived from the name).
        #[arg(long)]
        handle: Option<String>,
        /// Model provider: anthropic, openai, openrouter, ollama or an account id.
        #[arg(long)]
        provider: Option<String>,
        /// Model id for the provider.
        #[arg(long)]
        model: Option<String>,
        /// One-line description.
        #[arg(long)]
        description: Option<String>,
        /// Make it from a template (`adf template save`): its config, files
        /// and locks, with a fresh identity.
        #[arg(long, value_name = "TEMPLATE.adf")]
        template: Option<PathBuf>,
    },
    /// Copy an agent with a fresh identity (keys, DID, id) and a `clone`
    /// attestation naming the source; config, meta and the default
    /// documents always, the rest only when asked. The source is only read.
    Clone {
        src: PathBuf,
        dst: PathBuf,
        /// Also the loop, inbox, outbox, logs, tasks and audit rows.
        #[arg(long)]
        history: bool,
        /// Also every file, not only the default documents.
        #[arg(long)]
        files: bool,
        /// Also the agent's local_* tables.
        #[arg(long)]
        tables: bool,
    },
    /// A copy of an agent whose loop ends at a row (S<seq>), with a fresh
    /// identity: to retry from a point in the past.
    Fork {
        src: PathBuf,
        /// The last loop row to keep: S<seq>.
        #[arg(long = "at", value_name = "S<seq>")]
        at_row: String,
        dst: PathBuf,
    },
    /// What differs between two agent files: config, files, meta, tables
    /// and loop rows, like git diff (exit 1 when they differ).
    Diff { a: PathBuf, b: PathBuf },
    /// Templates: `save` an agent as one (`adf new --template` uses it).
    #[command(subcommand)]
    Template(clone::TemplateCmd),
    /// MCP servers of an agent: add (connects and declares its tools,
    /// restricted), ls, tool (flags), rm.
    #[command(subcommand)]
    Mcp(mcp::McpCmd),
    /// SKILL.md skills of an agent (the fleet's and its own): ls, add
    /// FOLDER, mute, unmute.
    #[command(subcommand)]
    Skills(skills::SkillsCmd),
    /// Open Knowledge Format bundles in an agent's files: ls [PREFIX].
    #[command(subcommand)]
    Okf(skills::OkfCmd),
    /// Summarise an agent file: versions, identity, meta, config, files, tables.
    Inspect { path: PathBuf },
    /// Check a damaged agent file and repair it: the original is kept under
    /// a new name (`FILE.corrupt`, never overwritten) and the report says
    /// what each table held before and after. Exit 1 if anything was lost.
    Repair {
        path: PathBuf,
        /// Only list every problem integrity_check finds; change nothing
        /// (exit 1 when there are any).
        #[arg(long)]
        check: bool,
    },
    /// The agent's files (virtual filesystem).
    #[command(subcommand)]
    Files(FilesCmd),
    /// The agent's metadata keys.
    #[command(subcommand)]
    Meta(MetaCmd),
    /// Side loops: named loops beside main with their own goal and tools.
    #[command(subcommand)]
    Loops(LoopsCmd),
    /// The agent's config document.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// Run SQL on an agent file, under the same guard as db_query/db_execute.
    Sql {
        path: PathBuf,
        /// One statement: SELECT/WITH/EXPLAIN reads, or a write to a local_* table.
        sql: String,
        /// Bind parameters, as JSON values (repeatable).
        #[arg(long = "param", short = 'p')]
        params: Vec<String>,
    },
    /// Measure the hot paths and print medians, or run a runtime scenario.
    Bench {
        /// What to measure.
        #[arg(value_enum, default_value_t = bench::Suite::Store)]
        suite: bench::Suite,
        /// Samples per measurement.
        #[arg(long, default_value_t = 200)]
        iterations: usize,
        /// Run a runtime scenario instead (real agents, scripted model).
        #[arg(long, value_enum)]
        scenario: Option<scenario::Scenario>,
        /// Override the scenario's agent count.
        #[arg(long)]
        agents: Option<usize>,
        /// Override the scenario's duration.
        #[arg(long)]
        seconds: Option<u64>,
        /// Drive every agent flat out (next turn as soon as one ends) instead
        /// of the reference driver's paced rate: a throughput test.
        #[arg(long)]
        flat_out: bool,
        /// The short form (CI): fewer agents and seconds where a suite
        /// has a long one (`daemon`).
        #[arg(long)]
        short: bool,
        /// Fail (exit status 1) when a figure is more than twice its target.
        #[arg(long)]
        check: bool,
        /// With --check: a figure not met yet (comma-separated or repeated),
        /// measured and said beside its target but not held; the check says
        /// when it is within twice its target and can be held again.
        #[arg(long = "known-miss", value_delimiter = ',', requires = "check")]
        known_miss: Vec<String>,
    },
    /// Run the fleet headless with the HTTP control API and event stream.
    ///
    /// Token: minted once into `daemon-token` in the config folder
    /// (`~/.config/adf/` on Linux, `$ADF_HOME/config` when ADF_HOME is set),
    /// mode 0600; local `adf` commands read it by themselves.
    /// `ADF_DAEMON_TOKEN` overrides it and is required to listen beyond
    /// loopback (16 characters at least there). Limits: a request head must
    /// arrive within 30 s and a body within 30 s (else 408); bodies are at
    /// most 2 MiB (413); open connections are capped (half the descriptor
    /// limit, 64 to 4,096), closing idle ones first. Settings (provider accounts, prices, reviewed agents):
    /// `settings.json` in the same folder. Logs: stderr (journald under
    /// systemd, see the README's unit). The fleet: `~/.local/share/adf/agents/`
    /// (`$ADF_HOME/data/agents`); `.daemon.json` there says where the daemon
    /// listens. One daemon per fleet: a second one says which process holds it.
    Daemon {
        /// Address to listen on.
        #[arg(long, env = "ADF_DAEMON_HOST", default_value = "127.0.0.1")]
        host: String,
        /// Port to listen on.
        #[arg(long, env = "ADF_DAEMON_PORT", default_value_t = 7385)]
        port: u16,
        /// Port of the agent-facing mesh server (agent messaging; the next
        /// 19 are tried when it is taken).
        #[arg(long, env = "ADF_MESH_PORT", default_value_t = 7295)]
        mesh_port: u16,
        /// Do not start the mesh server (same-fleet messaging still works).
        #[arg(long)]
        no_mesh: bool,
        /// Another name clients may reach the daemon by (a `Host` header it
        /// answers; repeatable): `NAME` means NAME:PORT, `NAME:PORT` as
        /// given. Loopback names always work; bound beyond loopback, so do
        /// the machine's own addresses and host name. Anything else is
        /// refused (403) against DNS rebinding.
        #[arg(long = "allow-host", value_name = "NAME")]
        allow_host: Vec<String>,
        /// Fleet folders and agent files (default: the fleet folder).
        paths: Vec<PathBuf>,
    },
    /// Summarise what an agent file would do unattended (tools, triggers,
    /// timers, network reach, provider), then record the review: the daemon
    /// only starts files you created here or reviewed.
    Review { path: PathBuf },
    /// ALF messages: `adf msg verify FILE` checks one stored as JSON.
    Msg {
        #[command(subcommand)]
        cmd: MsgCmd,
    },
    /// The owner's identity on this install: `show` (DIDs, `--phrase`),
    /// `restore` (from a recovery phrase).
    #[command(subcommand)]
    Identity(identity::IdentityCmd),
    /// Open a file's sealed envelopes: this install's key, then the owner's,
    /// then a password (asked for when the file has one).
    Unlock { path: PathBuf },
    /// The password that opens a file's credentials (for sharing it).
    #[command(subcommand)]
    Password(identity::PasswordCmd),
    /// A file's sealed secrets (provider keys, tokens).
    #[command(subcommand)]
    Credentials(identity::CredentialsCmd),
    /// Re-key a file owned by someone else to you: a new DID, a `clone`
    /// attestation naming the old one, credentials kept if a password opens them.
    Claim {
        path: PathBuf,
        /// Do not ask first.
        #[arg(long)]
        yes: bool,
    },
    /// Headless trust: let a daemon on another machine open chosen agents'
    /// credentials (key on that machine; grant, revoke, ls where they open).
    #[command(subcommand)]
    Trust(identity::TrustCmd),
    /// Attestations: `ls`, `issue`, `add`, `verify` (exit 1 when invalid).
    #[command(subcommand)]
    Attest(identity::AttestCmd),
    /// List the agents of the fleet (the default when no command is given).
    Agents,
    /// Approve the tool call a paused turn waits on (after `chat` exited 3);
    /// the turn goes on.
    Approve {
        path: PathBuf,
        task_id: String,
        /// Also lift the gate for this tool from now on.
        #[arg(long, conflicts_with_all = ["for_", "path_scope", "host"])]
        always: bool,
        /// Also grant the tool ahead of time (see adf grants add).
        #[command(flatten)]
        scope: grants::Scope,
    },
    /// Scoped, time-boxed grants: approve a restricted tool ahead of time
    /// for a while, under a folder or on a host (ls, add, rm).
    #[command(subcommand)]
    Grants(grants::GrantsCmd),
    /// Reject the tool call a paused turn waits on, with feedback the model sees.
    Deny { path: PathBuf, task_id: String, reason: Vec<String> },
    /// Daemon: put an event straight into an agent, past its trigger
    /// filters (`adf trigger AGENT inbox '{"message": …}'`). Agent scope
    /// wakes the model; `--lambda`/`--command` run a system target.
    Trigger {
        agent: PathBuf,
        /// inbox, outbox, file_change, chat, timer, tool_call, task_create,
        /// task_complete, log_entry, llm_call or startup.
        event_type: String,
        /// The event's data as JSON (required except for startup).
        data: Option<String>,
        /// Run this lambda (path[:fn]) in system scope.
        #[arg(long, conflicts_with = "command")]
        lambda: Option<String>,
        /// Run this shell command in system scope.
        #[arg(long)]
        command: Option<String>,
    },
    /// Daemon: an agent's live status.
    Status { agent: String },
    /// Daemon: start an agent (load it if it is off, lift a suspension).
    Start { agent: String },
    /// Daemon: stop and unload an agent.
    Stop { agent: String },
    /// Daemon: abort an agent's running turn.
    Abort { agent: String },
    /// Daemon: the runtime, or one agent's runtime status.
    Runtime { agent: Option<String> },
    /// Daemon: model providers, as metadata (never keys).
    Providers,
    /// Daemon: one file of an agent, to stdout.
    File { agent: String, path: String },
    /// Daemon: an agent's inbox.
    Inbox { agent: String },
    /// Daemon: an agent's outbox.
    Outbox { agent: String },
    /// Daemon: an agent's timers.
    Timers { agent: String },
    /// Daemon: an agent's tasks.
    Tasks { agent: String },
    /// Daemon: one task.
    Task { agent: String, task_id: String },
    /// Daemon: an agent's pending asks.
    Asks { agent: String },
    /// Daemon: answer an ask.
    Answer {
        agent: String,
        request_id: String,
        #[arg(required = true, num_args = 1..)]
        text: Vec<String>,
    },
    /// Daemon: follow the event stream (of one agent, by id).
    Events { agent: Option<String> },
    /// Usage and cost: the app-wide ledger (every model call of every agent
    /// on this machine, compactions included) grouped by day, provider,
    /// model or agent; or of one agent file; or from the daemon for an
    /// agent name.
    Usage {
        path: Option<PathBuf>,
        /// Group the ledger by (default: day).
        #[arg(long, value_enum)]
        by: Option<crate::ledger::By>,
        /// From this UTC day on: YYYY-MM-DD, "today", or N days back ("7d").
        #[arg(long)]
        since: Option<String>,
    },
    /// The fleet's budget (`budget` in settings.json): what it is and what
    /// the fleet spent against it; `set '{"usd_day": 20}'`; `clear`.
    Budget {
        #[command(subcommand)]
        cmd: Option<usage::BudgetCmd>,
    },
    /// Real computers: host commands (`host on|off|allow|deny`), the
    /// container engine and image (`engine`, `image build`), external
    /// containers (`external add|rm`), all in settings.json; `status`.
    Compute {
        #[command(subcommand)]
        cmd: Option<compute::ComputeCmd>,
    },
    /// Channel adapters: add (Telegram), ls, rm; status through the daemon.
    #[command(subcommand)]
    Adapters(adapters::AdaptersCmd),
    /// Other runtimes this one can message, found by mDNS, the tailnet
    /// sweep (`tailscale status`) and manual host:port entries (`add`,
    /// `rm`), with their source and when they were last seen; from the
    /// fleet's daemon when one runs.
    Peers {
        #[command(subcommand)]
        cmd: Option<peers::PeersCmd>,
        /// Sweep now (the daemon sweeps every 45 s).
        #[arg(long)]
        refresh: bool,
    },
    /// Move an agent to another machine's daemon (a remote): stop it here,
    /// send its file, start it there; its DID goes with the file and the
    /// daemon here relays what arrives at its old inbox address. The file
    /// here is kept as FILE.moved.
    Move {
        /// The agent: a name of the fleet's daemon, or its file.
        agent: String,
        /// The remote (adf remote ls) to move it to.
        #[arg(long, value_name = "REMOTE")]
        to: String,
    },
    /// Daemons on other machines by name (`--remote NAME`): ls (with
    /// whether each answers), add NAME URL [--token-file F], rm NAME.
    #[command(subcommand)]
    Remote(remotes::RemoteCmd),
    /// Daemon tokens with a role (owner, approver, observer): new, ls, rm.
    #[command(subcommand)]
    Token(token::TokenCmd),
    /// How full a loop's context window is, and what takes the space.
    Context {
        path: PathBuf,
        /// A side loop (default: main).
        #[arg(long = "loop")]
        loop_name: Option<String>,
    },
    /// Why an agent is awake or stuck: its last turn, what it waits on, its
    /// next wake. A file (through its daemon when one runs it), or a name.
    Why { path: PathBuf },
    /// An agent's logs (adf_logs): a file, or an agent's name through the daemon.
    Logs {
        path: PathBuf,
        /// This level and the more severe: debug, info, warn, error.
        #[arg(long)]
        level: Option<String>,
        /// Only rows of this origin (executor, protection, lambda, …).
        #[arg(long)]
        origin: Option<String>,
        /// The newest N rows (default 100).
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// Keep printing new rows until interrupted.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Resolve a `[S<seq>]` citation to the loop row it names (live, or
    /// from the audit archive after compaction).
    Cite { path: PathBuf, citation: String },
    /// Lint the agent's memory pages: dangling citations, broken links,
    /// orphan and stale pages, contradicting facts. Exits 1 on findings.
    Lint {
        path: PathBuf,
        /// Days a page may stay unchanged while the agent works (default 30).
        #[arg(long, default_value_t = crate::store::lint::DEFAULT_STALE_DAYS, value_parser = clap::value_parser!(u32).range(1..=36500))]
        stale_days: u32,
    },
    /// Send a message. With an agent file: run one turn in-process, the
    /// reply streaming to stdout. With an agent's name: through the daemon.
    Chat {
        path: PathBuf,
        #[arg(required = true, num_args = 1..)]
        message: Vec<String>,
        /// The loop to talk to.
        #[arg(long = "loop", default_value = "main")]
        loop_name: String,
        /// Through the daemon: print the turn's id and return at once
        /// instead of streaming the reply.
        #[arg(long)]
        no_wait: bool,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum FilesCmd {
    /// `adf files AGENT`: an agent's files, from the daemon.
    #[command(external_subcommand)]
    Agent(Vec<String>),
    /// List files, optionally only those under PREFIX.
    Ls { path: PathBuf, prefix: Option<String> },
    /// Write a file's exact bytes to stdout.
    Cat { path: PathBuf, file: String },
    /// Write a file from LOCAL, or from stdin when LOCAL is absent or "-".
    Put {
        path: PathBuf,
        file: String,
        local: Option<PathBuf>,
        /// MIME type (default: from the file name).
        #[arg(long)]
        mime: Option<String>,
        /// Protection for a new file: read_only, no_delete or none.
        #[arg(long)]
        protection: Option<String>,
    },
    /// Delete a file (protected files are refused).
    Rm { path: PathBuf, file: String },
    /// Set a file's protection.
    Protect {
        path: PathBuf,
        file: String,
        /// read_only, no_delete or none.
        level: String,
    },
    /// Rename a file.
    Mv { path: PathBuf, from: String, to: String },
    /// Mark a file as authorized code (its lambdas may use restricted
    /// tools); any later write clears the mark.
    Authorize {
        path: PathBuf,
        file: String,
        /// Clear the mark instead.
        #[arg(long)]
        off: bool,
    },
}

/// What `adf loops new` and `adf loops set` give a loop.
#[derive(Debug, Clone, clap::Args)]
pub struct LoopFields {
    #[arg(long)]
    pub goal: Option<String>,
    /// Comma-separated allowlist (fs_read,loop_send); default: every tool the agent has.
    #[arg(long, value_delimiter = ',')]
    pub tools: Option<Vec<String>>,
    #[arg(long)]
    pub model: Option<String>,
    /// reactive, scheduled or continuous.
    #[arg(long)]
    pub mode: Option<String>,
    /// A cron expression ("0 * * * *") or "every 30m".
    #[arg(long)]
    pub schedule: Option<String>,
    #[arg(long)]
    pub compact_threshold: Option<u64>,
    /// Turns a continuous loop takes on one wake (1 to 1000; default 20, which 0 restores).
    #[arg(long)]
    pub max_turns: Option<u64>,
}

#[derive(Debug, Clone, Subcommand)]
pub enum LoopsCmd {
    /// List an agent's loops (main and its side loops).
    Ls { path: PathBuf },
    /// Create a side loop.
    New {
        path: PathBuf,
        name: String,
        /// memory, researcher, critic, reflector or lint (`adf loops templates`).
        #[arg(long)]
        template: Option<String>,
        #[command(flatten)]
        fields: LoopFields,
        /// Its own budget, as limits.budget: '{"usd_day": 1}'.
        #[arg(long)]
        budget: Option<String>,
    },
    /// Change a side loop: only what is given changes (`--max-turns 0`
    /// and `--model ''` go back to the defaults).
    Set {
        path: PathBuf,
        name: String,
        #[command(flatten)]
        fields: LoopFields,
    },
    /// Set (or with 'null' remove) a side loop's own budget.
    Budget { path: PathBuf, name: String, budget: String },
    /// Delete a side loop (its stream is archived to the audit table).
    Rm { path: PathBuf, name: String },
    /// Pause a side loop: no schedule, no wakes until resumed.
    Pause { path: PathBuf, name: String },
    /// Resume a paused side loop.
    Resume { path: PathBuf, name: String },
    /// A side loop's rows.
    Show { path: PathBuf, name: String },
    /// The templates `new --template` takes.
    Templates,
}

#[derive(Debug, Clone, Subcommand)]
pub enum MetaCmd {
    /// List every key with its protection.
    Ls { path: PathBuf },
    /// Print one key's value.
    Get { path: PathBuf, key: String },
    /// Set a key (protection applies on creation, or changes it).
    Set {
        path: PathBuf,
        key: String,
        value: String,
        /// none, readonly or increment.
        #[arg(long)]
        protection: Option<String>,
    },
    /// Add a number to a key atomically.
    Add {
        path: PathBuf,
        key: String,
        #[arg(allow_hyphen_values = true)]
        delta: f64,
    },
    /// Delete a key.
    Rm { path: PathBuf, key: String },
}

#[derive(Debug, Clone, Subcommand)]
pub enum ConfigCmd {
    /// `adf config AGENT`: an agent's config, from the daemon.
    #[command(external_subcommand)]
    Agent(Vec<String>),
    /// Print the config, or the value at DOTTED.KEY (tools.fs_read.enabled).
    Get { path: PathBuf, key: Option<String> },
    /// Set DOTTED.KEY to a JSON value (a bare word is taken as a string).
    Set {
        path: PathBuf,
        key: String,
        #[arg(allow_hyphen_values = true)]
        value: String,
    },
    /// List the config's validation issues.
    Check { path: PathBuf },
}

/// Run one parsed command line; returns the exit status.
/// `--since` as a UTC day (for the daemon's `/usage` too).
pub fn usage_since(s: &str) -> anyhow::Result<String> {
    usage::since_day(s)
}

pub fn run(cli: Cli) -> anyhow::Result<u8> {
    let out = Out::new(cli.json);
    // `--remote`: one names the daemon (and its token); several list
    // their agents together.
    let mut url_owned = cli.url.clone();
    // The way to the one remote named (an SSH tunnel stays open while the
    // command or the app runs).
    let mut _conn = None;
    if matches!(cli.command, Some(Command::Move { .. })) && !cli.remote.is_empty() {
        anyhow::bail!("adf move runs where the agent runs: --to names the remote it goes to");
    }
    if !cli.remote.is_empty() && !matches!(cli.command, Some(Command::Remote(_))) {
        if url_owned.is_some() && std::env::var("ADF_DAEMON_URL").map_or(true, |e| Some(e) != cli.url) {
            anyhow::bail!("--remote and --url both name a daemon: give one");
        }
        let picked = crate::client::remotes::pick(&cli.remote)?;
        match (&picked[..], &cli.command) {
            ([], _) => anyhow::bail!("no remotes to talk to (adf remote add NAME URL)"),
            ([one], _) => {
                let c = one.connect()?;
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                // Another fleet at that address is refused; one that does
                // not answer is the command's to report.
                if let Err(e @ crate::client::remotes::Answer::Impostor(_)) = rt.block_on(one.whoami(&c.client())) {
                    anyhow::bail!("remote {}: {e}", one.name);
                }
                crate::client::Client::use_remote(&c);
                url_owned = Some(c.url().to_string());
                _conn = Some(c);
            }
            (many, Some(Command::Agents)) => return remotes::agents(&out, many),
            // The app over all of them, on a terminal; their agents
            // side by side for a script.
            (many, None) if std::io::IsTerminal::is_terminal(&std::io::stdout()) && !out.json => {
                if !cli.paths.is_empty() {
                    anyhow::bail!("the app attached to daemons shows their agents: name no files with --remote");
                }
                crate::tui::run(crate::tui::Options {
                    inline: cli.inline,
                    theme: cli.theme.clone(),
                    ascii: cli.ascii,
                    remotes: many.to_vec(),
                    ..Default::default()
                })?;
                return Ok(0);
            }
            (many, None) => return remotes::agents(&out, many),
            (_, _) => anyhow::bail!("this command talks to one daemon: name one remote (--remote NAME)"),
        }
    }
    let url = url_owned.as_deref();
    // An agent named on the command line (not a file): for the daemon.
    let arg = |p: &PathBuf| p.display().to_string();
    // A path that names a file which is not there is a typo, not an agent
    // of the daemon: say so instead of "no daemon answers".
    let missing = |p: &PathBuf| -> anyhow::Result<()> {
        let looks_like_file = p.extension().is_some_and(|e| e == "adf") || p.components().count() > 1;
        if looks_like_file && !p.exists() {
            anyhow::bail!("{}: no such file", p.display());
        }
        Ok(())
    };
    match &cli.command {
        Some(Command::Chat { path, message, loop_name, no_wait }) => {
            let text = message.join(" ");
            missing(path)?;
            let remote_chat = |agent: String| match loop_name.as_str() {
                "main" => remote::Remote::Chat(agent, text.clone(), !no_wait),
                lp => remote::Remote::LoopChat(agent, lp.to_string(), text.clone(), !no_wait),
            };
            if !path.is_file() {
                return remote::run(&out, url, remote_chat(arg(path)));
            }
            // Held by the app or a daemon: talk to the agent there.
            if let Some(via) = held::holder_api(path) {
                return remote::run(&out, Some(&via.client.base), remote_chat(via.agent));
            }
            return chat::run(&out, path, &text, loop_name);
        }
        Some(Command::Trigger { agent, event_type, data, lambda, command }) => {
            let data = match data {
                Some(d) => Some(serde_json::from_str::<serde_json::Value>(d).map_err(|e| {
                    anyhow::anyhow!("the event data is not JSON: {e} (e.g. '{{\"message\": {{\"content\": \"hi\"}}}}')")
                })?),
                None => None,
            };
            let mut event = serde_json::json!({"type": event_type});
            if let Some(d) = data {
                event["data"] = d;
            }
            let mut req = serde_json::json!({"event": event});
            if let Some(l) = lambda {
                req["scope"] = "system".into();
                req["lambda"] = l.clone().into();
            }
            if let Some(c) = command {
                req["scope"] = "system".into();
                req["command"] = c.clone().into();
            }
            if agent.is_file() {
                if let Some(via) = held::holder_api(agent) {
                    return remote::run(&out, Some(&via.client.base), remote::Remote::Trigger(via.agent, req));
                }
                anyhow::bail!(
                    "{} is not running: triggers go to a running agent (start the app or `adf daemon` first)",
                    agent.display()
                );
            }
            return remote::run(&out, url, remote::Remote::Trigger(arg(agent), req));
        }
        Some(Command::Approve { path, task_id, always, scope }) => {
            missing(path)?;
            if scope.is_set() {
                // The grant first: a bad pattern refuses the approval too.
                let tool = grants::task_tool(url, path, task_id)?;
                let g = grants::add(url, path, &tool, scope)?;
                eprintln!("adf: grant {} added for {tool}", g["id"].as_str().unwrap_or(""));
            }
            if !path.is_file() {
                return remote::run(&out, url, remote::Remote::Approve(arg(path), task_id.clone(), *always));
            }
            if let Some(via) = held::holder_api(path) {
                let r = remote::Remote::Approve(via.agent, task_id.clone(), *always);
                return remote::run(&out, Some(&via.client.base), r);
            }
            let decision = crate::runtime::executor::Decision::Approve { always: *always };
            return chat::drive(&out, path, chat::Work::Resolve { task_id, decision });
        }
        Some(Command::Deny { path, task_id, reason }) => {
            let reason = (!reason.is_empty()).then(|| reason.join(" "));
            missing(path)?;
            if !path.is_file() {
                return remote::run(&out, url, remote::Remote::Deny(arg(path), task_id.clone(), reason));
            }
            if let Some(via) = held::holder_api(path) {
                let r = remote::Remote::Deny(via.agent, task_id.clone(), reason);
                return remote::run(&out, Some(&via.client.base), r);
            }
            let decision = crate::runtime::executor::Decision::Deny { feedback: reason };
            return chat::drive(&out, path, chat::Work::Resolve { task_id, decision });
        }
        Some(Command::Why { path }) => {
            missing(path)?;
            let v = if path.is_file() {
                match held::holder_api(path) {
                    Some(via) => via.call(reqwest::Method::GET, &["why"], &[], None)?,
                    None => {
                        let store = output::open_for_read(path)?;
                        let v = crate::runtime::why::explain(&store, None).map_err(|e| output::at(path, e));
                        output::close(store)?;
                        let mut v = v?;
                        // Held by a process that serves no API: say who.
                        if let Some(h) = crate::store::current_holder(path)
                            && let Some(list) = v["waiting_on"].as_array_mut()
                        {
                            list.insert(
                                0,
                                serde_json::json!({"what": "held", "holder": format!("pid {} on {} since {}", h.pid, h.host, h.since)}),
                            );
                        }
                        v
                    }
                }
            } else {
                let client = crate::client::Client::find(url);
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                rt.block_on(client.get(&["agents", &arg(path), "why"]))?
            };
            if out.json {
                out.json(&v)?;
            } else {
                for l in crate::runtime::why::text(&v) {
                    out.line(l)?;
                }
            }
            return Ok(0);
        }
        Some(Command::Logs { path, level, origin, limit, follow }) => {
            if let Some(l) = level.as_deref()
                && !crate::store::logs::LEVELS.contains(&l)
            {
                anyhow::bail!("--level {l:?} is not one of {}", crate::store::logs::LEVELS.join(", "));
            }
            let o = logs::Opts { level: level.as_deref(), origin: origin.as_deref(), limit: *limit, follow: *follow };
            missing(path)?;
            return if path.is_file() {
                logs::file(&out, path, &o).map(|()| 0)
            } else {
                logs::remote(&out, url, &arg(path), &o).map(|()| 0)
            };
        }
        Some(Command::Usage { path, by, since }) => {
            return match path {
                Some(p) if p.is_file() => usage::run(&out, p).map(|()| 0),
                Some(p) if by.is_none() && since.is_none() => {
                    missing(p)?;
                    remote::run(&out, url, remote::Remote::Usage(Some(arg(p))))
                }
                Some(p) => anyhow::bail!(
                    "--by and --since read the app-wide ledger: leave out {} (or drop them to ask the daemon)",
                    p.display()
                ),
                None => usage::ledger(&out, by.unwrap_or(crate::ledger::By::Day), since.as_deref()).map(|()| 0),
            };
        }
        Some(Command::Budget { cmd }) => return usage::budget(&out, cmd.as_ref()).map(|()| 0),
        Some(Command::Compute { cmd }) => return compute::run(&out, cmd.as_ref()).map(|()| 0),
        Some(Command::Token(cmd)) => return token::run(&out, cmd).map(|()| 0),
        Some(Command::Remote(cmd)) => return remotes::run(&out, cmd),
        Some(Command::Move { agent, to }) => return moves::run(&out, url, agent, to),
        Some(Command::Peers { cmd, refresh }) => return peers::run(&out, url, cmd.as_ref(), *refresh),
        Some(Command::Fork { src, at_row, dst }) => return clone::fork(&out, src, at_row, dst).map(|()| 0),
        Some(Command::Lint { path, stale_days }) => {
            missing(path)?;
            return loops::lint(&out, path, *stale_days);
        }
        Some(Command::Diff { a, b }) => {
            missing(a)?;
            missing(b)?;
            return clone::diff(&out, a, b);
        }
        Some(Command::Grants(cmd)) => return grants::run(&out, url, cmd).map(|()| 0),
        Some(Command::Adapters(cmd)) => return adapters::run(&out, url, cmd).map(|()| 0),
        Some(Command::Agents) if crate::client::Client::configured(url) => {
            return remote::run(&out, url, remote::Remote::Agents);
        }
        Some(Command::Files(FilesCmd::Agent(args))) => {
            let [agent] = &args[..] else {
                anyhow::bail!("usage: adf files AGENT (or adf files ls|cat|put|rm|mv|protect|authorize PATH …)")
            };
            return remote::run(&out, url, remote::Remote::Files(agent.clone()));
        }
        Some(Command::Config(ConfigCmd::Agent(args))) => {
            let [agent] = &args[..] else {
                anyhow::bail!("usage: adf config AGENT (or adf config get|set|check PATH …)")
            };
            return remote::run(&out, url, remote::Remote::Config(agent.clone()));
        }
        Some(
            c @ (Command::Status { .. }
            | Command::Start { .. }
            | Command::Stop { .. }
            | Command::Abort { .. }
            | Command::Runtime { .. }
            | Command::Providers
            | Command::File { .. }
            | Command::Inbox { .. }
            | Command::Outbox { .. }
            | Command::Timers { .. }
            | Command::Tasks { .. }
            | Command::Task { .. }
            | Command::Asks { .. }
            | Command::Answer { .. }
            | Command::Events { .. }),
        ) => {
            use remote::Remote as R;
            let r = match c.clone() {
                Command::Status { agent } => R::Status(agent),
                Command::Start { agent } => R::Start(agent),
                Command::Stop { agent } => R::Stop(agent),
                Command::Abort { agent } => R::Abort(agent),
                Command::Runtime { agent } => R::Runtime(agent),
                Command::Providers => R::Providers,
                Command::File { agent, path } => R::File(agent, path),
                Command::Inbox { agent } => R::Inbox(agent),
                Command::Outbox { agent } => R::Outbox(agent),
                Command::Timers { agent } => R::Timers(agent),
                Command::Tasks { agent } => R::Tasks(agent),
                Command::Task { agent, task_id } => R::Task(agent, task_id),
                Command::Asks { agent } => R::Asks(agent),
                Command::Answer { agent, request_id, text } => R::Answer(agent, request_id, text.join(" ")),
                Command::Events { agent } => R::Events(agent),
                _ => unreachable!("matched above"),
            };
            return remote::run(&out, url, r);
        }
        // A word that is neither a command nor an existing path is a typo
        // of a command (a usage error), not a folder to open.
        None if cli.paths.iter().any(|p| !p.exists()) => {
            let p = cli.paths.iter().find(|p| !p.exists()).cloned().unwrap_or_default();
            let pathlike = p.extension().is_some_and(|e| e == "adf") || p.components().count() > 1;
            if pathlike {
                anyhow::bail!("{}: no such file or folder", p.display());
            }
            eprintln!("adf: unrecognized command '{}' (and no such file or folder)", p.display());
            eprintln!("usage: adf [OPTIONS] [DIR|FILE.adf]... | adf <COMMAND> (see --help)");
            return Ok(2);
        }
        // Without a command: the terminal app on a terminal, the agent
        // list when the output is a pipe (scripts).
        None if std::io::IsTerminal::is_terminal(&std::io::stdout()) && !out.json => {
            crate::tui::run(crate::tui::Options {
                inline: cli.inline,
                theme: cli.theme.clone(),
                ascii: cli.ascii,
                files: Vec::new(),
                paths: cli.paths.clone(),
                daemon: cli.daemon,
                url: url.map(str::to_string),
                remotes: Vec::new(),
            })?;
            return Ok(0);
        }
        _ => {}
    }
    if let Some(Command::Msg { cmd: MsgCmd::Verify { file } }) = &cli.command {
        return msg::verify(&out, file);
    }
    if let Some(Command::Repair { path, check }) = &cli.command {
        return repair::run(&out, path, *check);
    }
    if let Some(Command::Attest(cmd)) = cli.command.clone() {
        return identity::attest(&out, cmd);
    }
    run_simple(cli.command, &out).map(|()| 0)
}

fn run_simple(command: Option<Command>, out: &Out) -> anyhow::Result<()> {
    match command {
        Some(Command::Daemon { host, port, paths, mesh_port, no_mesh, allow_host }) => crate::daemon::run(
            crate::daemon::Options {
                host,
                port,
                paths,
                mesh_port: (!no_mesh).then_some(mesh_port),
                allow_hosts: allow_host,
                limits: crate::daemon::conn::Limits::from_env(),
                ..Default::default()
            },
            crate::runtime::fleet::accounts_factory(),
        ),
        None | Some(Command::Agents) => fleet::agents(out),
        Some(Command::Review { path }) => fleet::review(out, &path),
        // Answered with its exit status in `run`.
        Some(Command::Msg { cmd: MsgCmd::Verify { file } }) => msg::verify(out, &file).map(|_| ()),
        Some(Command::New { path, name, handle, provider, model, description, template: Some(t) }) => {
            let o = clone::FromTemplate {
                name: name.as_deref(),
                handle: handle.as_deref(),
                provider: provider.as_deref(),
                model: model.as_deref(),
                description: description.as_deref(),
            };
            clone::new_from_template(out, &path, &t, o)
        }
        Some(Command::New { path, name, handle, provider, model, description, template: None }) => {
            fleet::new(out, &path, name, handle, provider, model, description)
        }
        Some(Command::Clone { src, dst, history, files, tables }) => {
            clone::clone(out, &src, &dst, crate::store::derive::CloneOptions { history, files, tables })
        }
        Some(Command::Template(cmd)) => clone::template(out, cmd),
        Some(Command::Mcp(cmd)) => mcp::run(out, cmd),
        Some(Command::Skills(cmd)) => skills::run(out, cmd),
        Some(Command::Okf(cmd)) => skills::okf(out, cmd),
        Some(Command::Inspect { path }) => inspect::run(out, &path),
        Some(Command::Identity(cmd)) => identity::identity(out, cmd),
        Some(Command::Unlock { path }) => identity::unlock(out, &path),
        Some(Command::Password(cmd)) => identity::password(out, cmd),
        Some(Command::Credentials(cmd)) => identity::credentials(out, cmd),
        Some(Command::Claim { path, yes }) => identity::claim(out, &path, yes),
        Some(Command::Trust(cmd)) => identity::trust(out, cmd),
        Some(Command::Files(cmd)) => files::run(out, cmd),
        Some(Command::Meta(cmd)) => meta::run(out, cmd),
        Some(Command::Cite { path, citation }) => loops::cite(out, &path, &citation),
        Some(Command::Context { path, loop_name }) => loops::context(out, &path, loop_name.as_deref()),
        Some(Command::Loops(cmd)) => loops::run(out, cmd),
        Some(Command::Config(cmd)) => config::run(out, cmd),
        Some(Command::Sql { path, sql, params }) => sql::run(out, &path, &sql, &params),
        Some(Command::Bench { scenario: Some(sc), agents, seconds, flat_out, check, known_miss, .. }) => {
            let check = bench_check::Check { on: check, known_misses: known_miss };
            scenario::run(out, sc, agents, seconds, flat_out, &check)
        }
        Some(Command::Bench { suite, iterations, short, check, known_miss, .. }) => {
            bench::run(out, suite, iterations, short, &bench_check::Check { on: check, known_misses: known_miss })
        }
        Some(_) => Ok(()),
    }
}
