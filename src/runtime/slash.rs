//! The owner's slash commands (issue 18), shared by the app's composer,
//! `adf chat` and the agent actor (so a daemon's clients get them too):
//! `/compact [what to keep]`, `/clear`, `/idle`, `/hibernate`, `/stop`,
//! `/help`, and `/<skill> args` for each installed skill. A `/word` that is
//! none of these is sent as text, after the front end says so.

/// What a message starting with `/` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slash<'a> {
    /// Not a command: an ordinary message.
    Text,
    /// Compact the loop now, steered by what to keep.
    Compact(Option<&'a str>),
    Clear,
    /// `idle`, `hibernate` or `off` (`/stop`).
    State(&'static str),
    Help,
    /// `/<word> …` that is no built-in: a skill if one has that name,
    /// else text (the front end says so).
    Other(&'a str),
}

/// The built-in commands with what they do, for `/help`.
pub const COMMANDS: &[(&str, &str)] = &[
    ("/compact [what to keep]", "summarise the loop now, keeping what you name"),
    ("/clear", "clear the loop (archived first when loop audit is on)"),
    ("/idle", "set the agent idle: it waits for messages and timers"),
    ("/hibernate", "hibernate the agent: only its timers wake it"),
    ("/stop", "stop the agent (state off) until it is started again"),
    ("/help", "this list, with the installed skills"),
];

/// Read a message.
pub fn parse(text: &str) -> Slash<'_> {
    let t = text.trim_start();
    let Some(rest) = t.strip_prefix('/') else { return Slash::Text };
    let (word, args) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let args = args.trim();
    match word {
        "" => Slash::Text,
        "compact" => Slash::Compact((!args.is_empty()).then_some(args)),
        "clear" if args.is_empty() => Slash::Clear,
        "idle" if args.is_empty() => Slash::State("idle"),
        "hibernate" if args.is_empty() => Slash::State("hibernate"),
        "stop" if args.is_empty() => Slash::State("off"),
        "help" if args.is_empty() => Slash::Help,
        // A path (`/etc/hosts is odd`) is text, not a command.
        w if w.contains('/') => Slash::Text,
        w => Slash::Other(w),
    }
}

/// `/help`: the commands, then one line per skill (name, description).
pub fn help(skills: &[(String, String)]) -> String {
    let mut out = String::from("Commands:\n");
    for (c, d) in COMMANDS {
        out.push_str(&format!("  {c:<26} {d}\n"));
    }
    if skills.is_empty() {
        out.push_str("No skills are installed (`adf skills` lists and adds them).\n");
    } else {
        out.push_str("Skills:\n");
        for (name, desc) in skills {
            out.push_str(&format!("  /{:<25} {desc}\n", format!("{name} [args]")));
        }
    }
    out
}

/// The notice for a `/word` that is neither a command nor a skill.
pub fn unknown_notice(word: &str) -> String {
    format!("/{word} is not a command or an installed skill (see /help); sending it as text")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn commands_and_text() {
        assert_eq!(parse("/compact keep the API notes"), Slash::Compact(Some("keep the API notes")));
        assert_eq!(parse("/compact"), Slash::Compact(None));
        assert_eq!(parse("  /clear"), Slash::Clear);
        assert_eq!(parse("/stop"), Slash::State("off"));
        assert_eq!(parse("/idle"), Slash::State("idle"));
        assert_eq!(parse("/hibernate"), Slash::State("hibernate"));
        assert_eq!(parse("/help"), Slash::Help);
        assert_eq!(
            parse("/clear the decks"),
            Slash::Other("clear"),
            "a command with words after it is not that command"
        );
        assert_eq!(parse("/review src/main.rs"), Slash::Other("review"));
        assert_eq!(parse("/etc/hosts looks odd"), Slash::Text);
        assert_eq!(parse("hello /idle"), Slash::Text);
        assert_eq!(parse("/"), Slash::Text);
        let h = help(&[("review".into(), "Review code".into())]);
        assert!(h.contains("/compact") && h.contains("/review [args]") && h.contains("Review code"));
    }

    proptest! {
        #[test]
        fn text_without_a_leading_slash_is_always_text(s in "[^/\\s][^\n]{0,40}") {
            prop_assert_eq!(parse(&s), Slash::Text);
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,60}") {
            let _ = parse(&s);
        }
    }
}
