//! The side-loop templates the app and `adf loops new --template` offer:
//! each a goal, a tool set and a default mode and schedule, which the user
//! may change when creating the loop or later.

use crate::store::loops::{LoopMode, LoopSpec};

/// (name, one-line summary) of every template.
pub const TEMPLATES: &[(&str, &str)] = &[
    ("memory", "memory consolidator: turns recent history into memory pages with [S<seq>] citations (hourly)"),
    ("researcher", "researcher: looks things up for the main loop and reports back (when sent a message)"),
    ("critic", "critic: reviews the main loop's work and sends it concrete objections (when sent a message)"),
    (
        "reflector",
        "reflector: watches the agent for idle streaks, repeated calls and spend without progress (every 6 h)",
    ),
    ("lint", "memory lint: contradictions, stale and orphan pages, dangling citations, reported to the owner (daily)"),
];

fn tools(list: &[&str]) -> Option<Vec<String>> {
    Some(list.iter().map(|s| s.to_string()).collect())
}

/// The spec a template stands for.
pub fn spec(name: &str) -> Result<LoopSpec, String> {
    let (goal, tools, mode, schedule) = match name {
        "memory" => (
            "Consolidate memory. Read the agent's recent loop history (db_query on adf_loop, newest rows since the \
             last consolidation noted in mind/log.md) and fold what was learned into topic pages mind/<topic>.md, \
             keeping mind.md an index of them. Cite every fact with the [S<seq>] of the loop row it came from. \
             Append one line per run to mind/log.md (never rewrite it).",
            tools(&["fs_read", "fs_write", "fs_list", "db_query", "memory_cite", "loop_send"]),
            LoopMode::Scheduled,
            Some("0 * * * *"),
        ),
        "researcher" => (
            "Research what the main loop asks for: read the agent's files, fetch sources, and answer with a short, \
             cited report sent back with loop_send to main.",
            tools(&["fs_read", "fs_list", "sys_fetch", "db_query", "loop_send"]),
            LoopMode::Reactive,
            None,
        ),
        "critic" => (
            "Review the work the main loop sends you (or its latest output in adf_loop): find errors, gaps and \
             unsupported claims, and send concrete, numbered objections back to main with loop_send.",
            tools(&["fs_read", "fs_list", "db_query", "loop_send"]),
            LoopMode::Reactive,
            None,
        ),
        "reflector" => (
            "Observe the agent itself: from adf_loop, adf_logs and adf_tasks find idle streaks, tool calls repeated \
             without new results, and model spend without progress. Write findings to mind/reflection.md and tell \
             main with loop_send when something needs to change.",
            tools(&["fs_read", "fs_write", "db_query", "loop_send"]),
            LoopMode::Scheduled,
            Some("every 6h"),
        ),
        "lint" => (
            "Lint memory. Each scheduled run opens with the built-in lint's report (memory_lint runs it again): \
             citations that resolve to nothing, broken links, pages no link from mind.md reaches, stale pages and \
             facts stated with different values. Read the pages involved, decide which statement holds (memory_cite \
             shows the row a citation names), look for contradictions the checks cannot see, fix the pages, and \
             write the report to mind/lint.md. Send main a summary with loop_send when something needs it.",
            tools(&["fs_read", "fs_write", "fs_list", "db_query", "memory_cite", "memory_lint", "loop_send"]),
            LoopMode::Scheduled,
            Some("0 6 * * *"),
        ),
        other => {
            let names: Vec<&str> = TEMPLATES.iter().map(|(n, _)| *n).collect();
            return Err(format!("no loop template {other:?}; the templates are {}", names.join(", ")));
        }
    };
    Ok(LoopSpec {
        goal: Some(goal.to_string()),
        tools,
        model: None,
        compact_threshold: None,
        mode: Some(mode),
        schedule: schedule.map(str::to_string),
        template: Some(name.to_string()),
        budget: None,
        max_turns: None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_listed_template_builds_and_unknown_ones_are_named() {
        for (name, _) in super::TEMPLATES {
            let s = super::spec(name).unwrap();
            assert_eq!(s.template.as_deref(), Some(*name));
            if let Some(sch) = &s.schedule {
                crate::store::loops::next_run(sch, 0).unwrap();
            }
        }
        assert!(super::spec("nope").unwrap_err().contains("memory"));
    }
}
