//! Form answers by reply (messaging.md §14). Where a channel has no
//! buttons (email, WhatsApp) a form goes out as a numbered list
//! (`form_text`) and comes back as a reply such as `1a, 2b c, 3 Friday
//! after lunch`. This reads such a reply against the form that was sent,
//! checks every answer (the question exists, the letters are its options,
//! one pick for a single choice), and gives the agent one structured
//! message, or says what is wrong so the agent can ask again.

use serde_json::{Map, Value, json};

/// The part of a reply written above the quoted original: quoting starts
/// at a `>` line, an `On … wrote:` line or an `Original Message` rule.
pub fn unquoted(text: &str) -> String {
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        let wrote = t.starts_with("On ") && t.ends_with("wrote:");
        if t.starts_with('>') || wrote || t.contains("-----Original Message-----") {
            break;
        }
        out.push(line);
    }
    out.join("\n").trim().to_string()
}

/// Where each question's answer starts: a question number at the start of
/// the reply or after a separator (`,` `;` or a new line), optionally
/// followed by `.` `)` or `:`.
fn markers(reply: &str, questions: usize) -> Vec<(usize, usize, usize)> {
    let b = reply.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut at_start = true;
    while i < b.len() {
        let c = b[i];
        if at_start && c.is_ascii_digit() {
            let mut j = i;
            while j < b.len() && b[j].is_ascii_digit() && j - i < 2 {
                j += 1;
            }
            let n: usize = reply[i..j].parse().unwrap_or(0);
            let next_is_digit = b.get(j).is_some_and(u8::is_ascii_digit);
            if (1..=questions).contains(&n) && !next_is_digit {
                let mut k = j;
                if matches!(b.get(k), Some(b'.' | b')' | b':')) {
                    k += 1;
                }
                out.push((n - 1, i, k));
                i = k;
                at_start = false;
                continue;
            }
        }
        if matches!(c, b',' | b';' | b'\n') {
            at_start = true;
        } else if !c.is_ascii_whitespace() {
            at_start = false;
        }
        i += 1;
    }
    out
}

/// One choice question's picks from its answer text: option letters
/// (`a`, `b c`, `a,c`) or an option's label.
fn picks(q: &Value, text: &str) -> Result<Vec<Value>, String> {
    let options = q["options"].as_array().cloned().unwrap_or_default();
    let by_label =
        options.iter().find(|o| o["label"].as_str().is_some_and(|l| l.eq_ignore_ascii_case(text.trim()))).cloned();
    if let Some(o) = by_label {
        return Ok(vec![o]);
    }
    let mut out = Vec::new();
    for word in text.split(|c: char| c == ',' || c == ';' || c.is_whitespace()).filter(|w| !w.is_empty()) {
        let w = word.trim_end_matches([')', '.']).to_ascii_lowercase();
        let idx = match w.as_bytes() {
            [c @ b'a'..=b'z'] => (c - b'a') as usize,
            _ => return Err(format!("\"{word}\" is not one of its options (answer with a letter)")),
        };
        let o = options.get(idx).ok_or_else(|| format!("it has no option {w}"))?;
        if !out.contains(o) {
            out.push(o.clone());
        }
    }
    Ok(out)
}

/// One answer given on a platform's own controls (a button, a vote, a
/// reply to a free-text question), checked against the form sent: the
/// `source_context` fields and the text the agent reads, or `None` when it
/// answers nothing in that form. `__text` carries `text`, `__done` closes
/// a multiple choice.
pub fn control_answer(
    form: &Value,
    q_id: &str,
    answer_id: &str,
    text: Option<&str>,
) -> Option<(Map<String, Value>, String)> {
    let form_id = form["id"].as_str().unwrap_or("form");
    let q = form["questions"].as_array()?.iter().find(|q| q["id"] == q_id)?;
    let value = match (answer_id, text) {
        ("__text", Some(t)) => t.to_string(),
        ("__done", _) => "(done)".to_string(),
        (opt, _) => q["options"].as_array()?.iter().find(|o| o["id"] == opt)?["label"].as_str()?.to_string(),
    };
    let mut ctx = Map::new();
    ctx.insert("form_id".into(), form_id.into());
    ctx.insert("question_id".into(), q_id.into());
    ctx.insert("answer_id".into(), answer_id.into());
    ctx.insert("answer_value".into(), value.clone().into());
    let shown = format!("[form {form_id}] {}: {value}", q["text"].as_str().unwrap_or(q_id));
    Some((ctx, shown))
}

/// A reply to `form` read into the message: its answers (in the context)
/// and their summary replace the text, or why they are not answers is
/// said beside it (`form_error`).
pub fn apply_reply(form: &Value, m: &mut super::Inbound) {
    match read_reply(form, &m.text) {
        Ok((ctx, text)) => {
            m.context.extend(ctx);
            m.text = text;
        }
        Err(why) => {
            let id = form["id"].as_str().unwrap_or("form");
            m.context.insert("form_error".into(), why.clone().into());
            m.text = format!("{}\n\n[not an answer to form {id}: {why}]", m.text);
        }
    }
}

/// Read a reply against the form it answers: the `source_context` fields
/// (`form_id`, `answers`) and the text the agent reads, or what is wrong.
pub fn read_reply(form: &Value, reply: &str) -> Result<(Map<String, Value>, String), String> {
    let id = form["id"].as_str().unwrap_or("form");
    let qs = form["questions"].as_array().cloned().unwrap_or_default();
    let reply = unquoted(reply);
    let found = markers(&reply, qs.len());
    let mut given: Vec<Option<String>> = vec![None; qs.len()];
    for (n, (q, _, body)) in found.iter().enumerate() {
        let end = found.get(n + 1).map(|m| m.1).unwrap_or(reply.len());
        let text = reply[*body..end].trim().trim_end_matches([',', ';']).trim().to_string();
        given[*q] = Some(text);
    }
    // A form of one question may be answered without its number.
    if qs.len() == 1 && given[0].is_none() && !reply.is_empty() {
        given[0] = Some(reply.clone());
    }
    let mut answers = Vec::new();
    let mut shown = Vec::new();
    let mut problems = Vec::new();
    for (i, q) in qs.iter().enumerate() {
        let label = q["text"].as_str().unwrap_or("");
        let Some(text) = given[i].as_ref().filter(|t| !t.is_empty()) else {
            problems.push(format!("question {} is not answered", i + 1));
            continue;
        };
        let ty = q["type"].as_str().unwrap_or("text");
        if ty == "text" {
            answers.push(json!({"question_id": q["id"], "answer_id": "__text", "answer_value": text}));
            shown.push(format!("{label}: {text}"));
            continue;
        }
        match picks(q, text) {
            Ok(p) if p.is_empty() => problems.push(format!("question {} is not answered", i + 1)),
            Ok(p) if ty == "choice" && p.len() > 1 => {
                problems.push(format!("question {} takes one answer, got {}", i + 1, p.len()))
            }
            Ok(p) => {
                let ids: Vec<&str> = p.iter().filter_map(|o| o["id"].as_str()).collect();
                let labels: Vec<&str> = p.iter().filter_map(|o| o["label"].as_str()).collect();
                answers.push(
                    json!({"question_id": q["id"], "answer_id": ids.join(","), "answer_value": labels.join(", ")}),
                );
                shown.push(format!("{label}: {}", labels.join(", ")));
            }
            Err(e) => problems.push(format!("question {}: {e}", i + 1)),
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    let mut ctx = Map::new();
    ctx.insert("form_id".into(), id.into());
    ctx.insert("answers".into(), Value::Array(answers));
    Ok((ctx, format!("[form {id}] {}", shown.join("; "))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form() -> Value {
        json!({"id": "lunch", "render": "compact", "questions": [
            {"id": "where", "type": "choice", "text": "Where?", "options": [{"id": "p", "label": "Pizza"}, {"id": "s", "label": "Sushi"}]},
            {"id": "extras", "type": "multi", "text": "Extras?", "options": [{"id": "d", "label": "Drink"}, {"id": "c", "label": "Cake"}, {"id": "t", "label": "Tea"}]},
            {"id": "when", "type": "text", "text": "When?"}]})
    }

    #[test]
    fn a_numbered_reply_becomes_one_structured_answer() {
        let reply = "1b, 2a c, 3 Friday, after 12\n\nOn Mon, 1 Dec 2026 Ann wrote:\n> 1. Where?\n";
        let (ctx, text) = read_reply(&form(), reply).unwrap();
        assert_eq!(ctx["form_id"], "lunch");
        assert_eq!(ctx["answers"][0], json!({"question_id": "where", "answer_id": "s", "answer_value": "Sushi"}));
        assert_eq!(ctx["answers"][1]["answer_id"], "d,t", "letters name options in order");
        assert_eq!(ctx["answers"][2]["answer_value"], "Friday, after 12", "free text keeps its commas");
        assert_eq!(text, "[form lunch] Where?: Sushi; Extras?: Drink, Tea; When?: Friday, after 12");
        // One per line, with dots and labels.
        let (ctx, _) = read_reply(&form(), "1. pizza\n2) a\n3: noon").unwrap();
        assert_eq!(ctx["answers"][0]["answer_id"], "p");
    }

    #[test]
    fn wrong_answers_are_named_and_nothing_is_taken() {
        let e = read_reply(&form(), "1 a b, 2 z").unwrap_err();
        assert!(e.contains("question 1 takes one answer, got 2"), "{e}");
        assert!(e.contains("question 2: it has no option z"), "{e}");
        assert!(e.contains("question 3 is not answered"), "{e}");
        assert!(read_reply(&form(), "> 1a, 2b, 3 now").is_err(), "quoted text is not an answer");
        let one = json!({"id": "ok", "questions": [{"id": "q", "type": "choice", "text": "OK?", "options": [{"id": "y", "label": "Yes"}]}]});
        assert_eq!(read_reply(&one, "yes").unwrap().0["answers"][0]["answer_id"], "y");
        assert_eq!(unquoted("fine\n-----Original Message-----\nold"), "fine");
    }
}
