//! The unified diff of a file change for `on_file_change` (runtime.md
//! §5.5): an LCS line diff with three lines of context and `--- a/<path>` /
//! `+++ b/<path>` headers; none when there was no previous content or when
//! `lines_old × lines_new` passes a million.

const CONTEXT: usize = 3;
const MAX_CELLS: usize = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Keep(usize, usize),
    Del(usize),
    Add(usize),
}

/// The diff from `old` to `new`, or `None` (no old text, or too large).
pub fn unified(path: &str, old: Option<&str>, new: &str) -> Option<String> {
    let old = old?;
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    if a.len().saturating_mul(b.len()) > MAX_CELLS {
        return None;
    }
    let ops = script(&a, &b);
    if ops.iter().all(|o| matches!(o, Op::Keep(..))) {
        return Some(String::new());
    }
    let mut out = format!("--- a/{path}\n+++ b/{path}\n");
    // Group changes into hunks separated by more than 2×CONTEXT kept lines.
    let changed: Vec<usize> =
        ops.iter().enumerate().filter(|(_, o)| !matches!(o, Op::Keep(..))).map(|(i, _)| i).collect();
    let mut i = 0;
    while i < changed.len() {
        let start = changed[i].saturating_sub(CONTEXT);
        let mut end = changed[i];
        while i + 1 < changed.len() && changed[i + 1] <= end + 2 * CONTEXT + 1 {
            i += 1;
            end = changed[i];
        }
        let end = (end + CONTEXT + 1).min(ops.len());
        let hunk = &ops[start..end];
        let (mut a0, mut b0) = (None, None);
        let (mut na, mut nb) = (0, 0);
        let mut body = String::new();
        for op in hunk {
            match *op {
                Op::Keep(x, y) => {
                    a0.get_or_insert(x);
                    b0.get_or_insert(y);
                    na += 1;
                    nb += 1;
                    body.push_str(&format!(" {}\n", a[x]));
                }
                Op::Del(x) => {
                    a0.get_or_insert(x);
                    na += 1;
                    body.push_str(&format!("-{}\n", a[x]));
                }
                Op::Add(y) => {
                    b0.get_or_insert(y);
                    nb += 1;
                    body.push_str(&format!("+{}\n", b[y]));
                }
            }
        }
        // Where a side has no lines in the hunk, its start is the line
        // before the hunk (0 at the top), as diff prints it.
        let a_start = if na == 0 { hunk_pos(&ops[..start], true) } else { a0.map(|x| x + 1).unwrap_or(0) };
        let b_start = if nb == 0 { hunk_pos(&ops[..start], false) } else { b0.map(|y| y + 1).unwrap_or(0) };
        out.push_str(&format!("@@ -{} +{} @@\n", range(a_start, na), range(b_start, nb)));
        out.push_str(&body);
        i += 1;
    }
    Some(out)
}

fn range(start: usize, n: usize) -> String {
    if n == 1 { format!("{start}") } else { format!("{start},{n}") }
}

/// Lines of one side before an index of the script.
fn hunk_pos(before: &[Op], old: bool) -> usize {
    before
        .iter()
        .filter(|o| match o {
            Op::Keep(..) => true,
            Op::Del(_) => old,
            Op::Add(_) => !old,
        })
        .count()
}

/// The edit script of a longest common subsequence.
fn script(a: &[&str], b: &[&str]) -> Vec<Op> {
    let (n, m) = (a.len(), b.len());
    // lcs[i][j] = LCS length of a[i..] and b[j..].
    let w = m + 1;
    let mut lcs = vec![0u32; (n + 1) * w];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i * w + j] =
                if a[i] == b[j] { lcs[(i + 1) * w + j + 1] + 1 } else { lcs[(i + 1) * w + j].max(lcs[i * w + j + 1]) };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut ops = Vec::with_capacity(n + m);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push(Op::Keep(i, j));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[(i + 1) * w + j] >= lcs[i * w + j + 1]) {
            // Deletions before additions, as diff prints a replacement.
            ops.push(Op::Del(i));
            i += 1;
        } else {
            ops.push(Op::Add(j));
            j += 1;
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_change_in_the_middle_has_three_lines_of_context() {
        let old = "1\n2\n3\n4\n5\n6\n7\n8\n9\n";
        let new = "1\n2\n3\n4\nfive\n6\n7\n8\n9\n";
        assert_eq!(
            unified("n.md", Some(old), new).unwrap(),
            "--- a/n.md\n+++ b/n.md\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"
        );
    }

    #[test]
    fn far_apart_changes_make_two_hunks_and_additions_at_the_top() {
        let old: String = (1..=20).map(|i| format!("{i}\n")).collect();
        let new = format!("0\n{}", old.replace("20\n", "twenty\n"));
        let d = unified("x", Some(&old), &new).unwrap();
        assert_eq!(d.matches("@@").count(), 4, "{d}");
        assert!(d.contains("@@ -1,3 +1,4 @@\n+0\n 1\n 2\n 3\n"), "{d}");
        assert!(d.ends_with("-20\n+twenty\n"), "{d}");
    }

    #[test]
    fn none_without_old_content_or_when_too_large() {
        assert_eq!(unified("x", None, "a"), None);
        let big: String = (0..1001).map(|i| format!("{i}\n")).collect();
        assert_eq!(unified("x", Some(&big), &big.replace("5\n", "6\n")), None);
        assert_eq!(unified("x", Some("same\n"), "same\n"), Some(String::new()));
        assert_eq!(unified("x", Some(""), "new\n").unwrap(), "--- a/x\n+++ b/x\n@@ -0,0 +1 @@\n+new\n");
    }
}
