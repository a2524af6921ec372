//! pgbench scripts made from the project's own SQL, so the raw baselines run the very statements
//! the binaries run: from the SQL files, or from the sqlx query macros of a Rust file where the
//! statements live in code. Pure text manipulation: nothing here runs pgbench.

use std::fmt::Write as _;
use std::iter::Peekable;
use std::str::Chars;

use anyhow::{bail, ensure};

/// What one `$n` parameter becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg<'a> {
    /// A pgbench variable: `:name`.
    Var(&'a str),
    /// SQL text, pasted in place (e.g. `NULL`).
    Sql(&'a str),
}

/// One pgbench command from one statement as the code sends it; `args[n - 1]` replaces `$n`.
///
/// Comments are dropped and white space collapsed to one line. Each `$n` becomes a pgbench variable
/// (`:name`, sent as a bind parameter under `-M prepared`, as sqlx does) or SQL text (for what
/// pgbench cannot hold in a variable: NULL, a generated UUID). sqlx's type annotations on column
/// aliases (`AS "amount: Amount"`, `AS "fencing_token!"`) are removed, since `\gset` names its
/// variables after the columns. Every `$n` must be given an argument and every argument used, so a
/// statement that gains or loses a parameter breaks the benchmark loudly instead of silently
/// measuring something else.
pub fn command(sql: &str, args: &[Arg<'_>]) -> anyhow::Result<String> {
    let mut out = OneLine::default();
    let mut used = vec![false; args.len()];
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '-' if chars.peek() == Some(&'-') => {
                skip_line_comment(&mut chars);
                out.space();
            }
            '/' if chars.peek() == Some(&'*') => {
                skip_block_comment(&mut chars)?;
                out.space();
            }
            '\'' => out.push(&string_literal(&mut chars)?),
            '"' => out.push(&format!("\"{}\"", without_sqlx_annotation(&quoted_identifier(&mut chars)?))),
            '$' if chars.peek().is_some_and(char::is_ascii_digit) => {
                out.push(&parameter(&mut chars, args, &mut used)?);
            }
            '$' => bail!("dollar quoting is not supported in benchmarked statements"),
            c if c.is_whitespace() => out.space(),
            c => out.push(c.encode_utf8(&mut [0; 4])),
        }
    }
    if let Some(unused) = used.iter().position(|u| !u) {
        bail!("argument {} was given but the statement has no ${}", unused + 1, unused + 1);
    }
    let out = out.text.trim_end().trim_end_matches(';').trim_end().to_owned();
    ensure!(!out.contains(';'), "one statement at a time");
    Ok(out)
}

/// A statement, read a character at a time.
type Cursor<'a> = Peekable<Chars<'a>>;

/// A command collapsed to one line: tokens as written, one space where white space or a comment
/// stood between them.
#[derive(Default)]
struct OneLine {
    text: String,
    /// White space or a comment came since the last token.
    pending_space: bool,
}

impl OneLine {
    /// Appends `token`, after one space if white space or a comment came before it (never at the
    /// start).
    fn push(&mut self, token: &str) {
        if self.pending_space && !self.text.is_empty() {
            self.text.push(' ');
        }
        self.pending_space = false;
        self.text.push_str(token);
    }

    /// Notes white space or a comment before the next token.
    fn space(&mut self) {
        self.pending_space = true;
    }
}

/// Skips a `--` comment, its second `-` to the end of its line.
fn skip_line_comment(chars: &mut Cursor<'_>) {
    for next in chars.by_ref() {
        if next == '\n' {
            break;
        }
    }
}

/// Skips a `/* … */` comment, from its `*`.
fn skip_block_comment(chars: &mut Cursor<'_>) -> anyhow::Result<()> {
    chars.next();
    let mut previous = ' ';
    for next in chars.by_ref() {
        if previous == '*' && next == '/' {
            return Ok(());
        }
        previous = next;
    }
    bail!("an unterminated block comment")
}

/// A string literal, after its opening quote: the literal as written, both quotes and any doubled
/// quote in it included.
fn string_literal(chars: &mut Cursor<'_>) -> anyhow::Result<String> {
    let mut literal = String::from("'");
    while let Some(next) = chars.next() {
        literal.push(next);
        if next == '\'' {
            if chars.peek() == Some(&'\'') {
                literal.push('\'');
                chars.next();
            } else {
                return Ok(literal);
            }
        }
    }
    bail!("an unterminated string literal")
}

/// A quoted identifier, after its opening quote: what stands between the quotes.
fn quoted_identifier(chars: &mut Cursor<'_>) -> anyhow::Result<String> {
    let mut identifier = String::new();
    for next in chars.by_ref() {
        if next == '"' {
            return Ok(identifier);
        }
        identifier.push(next);
    }
    bail!("an unterminated quoted identifier")
}

/// What the parameter `$n` becomes, read after its `$`; marks argument `n` used.
fn parameter(chars: &mut Cursor<'_>, args: &[Arg<'_>], used: &mut [bool]) -> anyhow::Result<String> {
    let mut digits = String::new();
    while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
        digits.push(d);
        chars.next();
    }
    let n: usize = digits.parse()?;
    let Some(arg) = n.checked_sub(1).and_then(|i| args.get(i)) else {
        bail!("the statement uses ${n} but only {} arguments were given", args.len());
    };
    used[n - 1] = true;
    Ok(match arg {
        Arg::Var(name) => format!(":{name}"),
        Arg::Sql(sql) => format!("({sql})"),
    })
}

/// The SQL of every sqlx query macro (`query!`, `query_as!`, `query_scalar!` ...) in a Rust source
/// file, in the order written: the first string literal after each macro's opening parenthesis,
/// raw (`r#"…"#`) or plain. For statements that live in code rather than in a `.sql` file.
///
/// A plain literal with an escape (`\n`, `\"`, a line continuation) is refused rather than decoded.
pub fn macro_statements(source: &str) -> anyhow::Result<Vec<String>> {
    let mut statements = Vec::new();
    let mut rest = source;
    while let Some(at) = rest.find("sqlx::query") {
        rest = &rest[at + "sqlx::query".len()..];
        let name_end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        // `sqlx::query(…)` and `sqlx::query_as::<…>(…)` are functions, checked at run time: not
        // statements of the kind this reads.
        let Some(arguments) = rest[name_end..].strip_prefix("!(") else { continue };
        let Some(quote) = arguments.find('"') else { bail!("a query macro without a string literal") };
        let hashes = arguments[..quote].chars().rev().take_while(|&c| c == '#').count();
        let raw = arguments[..quote - hashes].ends_with('r');
        // Before the literal, at most a type and a comma (`query_as!(Row, …)`).
        let before = &arguments[..quote - hashes - usize::from(raw)];
        ensure!(!before.contains([')', ';']), "a query macro whose statement is not a string literal");
        let body = &arguments[quote + 1..];
        let (statement, after) = if raw {
            let end = format!("\"{}", "#".repeat(hashes));
            let Some(length) = body.find(&end) else { bail!("an unterminated raw string literal") };
            (&body[..length], &body[length + end.len()..])
        } else {
            let Some(length) = body.find(['"', '\\']) else { bail!("an unterminated string literal") };
            ensure!(body[length..].starts_with('"'), "an escape in a query macro's string literal");
            (&body[..length], &body[length + 1..])
        };
        statements.push(statement.to_owned());
        rest = after;
    }
    Ok(statements)
}

/// `name`, `name!`, `name?`, `name: Type`, `name!: Type` → `name`: the column name sqlx's
/// annotation is attached to. Anything else is left as it is.
fn without_sqlx_annotation(identifier: &str) -> &str {
    let name_end = identifier.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(identifier.len());
    let (name, rest) = identifier.split_at(name_end);
    let rest = rest.strip_prefix(['!', '?']).unwrap_or(rest);
    let annotated = name_end < identifier.len() && (rest.is_empty() || rest.trim_start().starts_with(':'));
    if !name.is_empty() && annotated { name } else { identifier }
}

/// A pgbench script: meta-commands and SQL commands, one transaction of the benchmark.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Script {
    lines: Vec<String>,
}

impl Script {
    /// An empty script.
    pub fn new() -> Self {
        Self::default()
    }

    /// `\set name expression`.
    pub fn set(mut self, name: &str, expression: &str) -> Self {
        self.lines.push(format!("\\set {name} {expression}"));
        self
    }

    /// A SQL command.
    pub fn sql(mut self, command: String) -> Self {
        self.lines.push(format!("{command};"));
        self
    }

    /// A SQL command whose one result row becomes variables named after its columns.
    pub fn sql_gset(mut self, command: String) -> Self {
        self.lines.push(format!("{command} \\gset"));
        self
    }

    /// The script file's text.
    pub fn text(&self) -> String {
        let mut text = String::new();
        for line in &self.lines {
            let _ = writeln!(text, "{line}");
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_become_variables_or_sql_and_comments_and_white_space_go() {
        let sql = "-- a comment with $9 in it\nSELECT a, 'it''s $1 -- not a comment'\n  FROM t /* $7 */\n\
                   WHERE x = $1 AND y = $2 AND z = $3;\n";

        let command = command(sql, &[Arg::Var("tenant"), Arg::Sql("NULL"), Arg::Var("key")]).unwrap();

        assert_eq!(
            command,
            "SELECT a, 'it''s $1 -- not a comment' FROM t WHERE x = :tenant AND y = (NULL) AND z = :key"
        );
    }

    #[test]
    fn a_missing_or_unused_argument_is_an_error() {
        assert!(command("SELECT $1, $2", &[Arg::Var("a")]).is_err());
        assert!(command("SELECT $1", &[Arg::Var("a"), Arg::Var("b")]).is_err());
        assert!(command("SELECT $0", &[]).is_err());
        assert!(command("SELECT $$text$$", &[]).is_err());
        assert!(command("SELECT 1; SELECT 2", &[]).is_err());
        assert!(command("SELECT 'open", &[]).is_err());
    }

    #[test]
    fn sqlx_annotations_on_aliases_are_removed() {
        let sql = r#"SELECT a AS "amount: Amount", b AS "token!", c AS "maybe?", d AS "kept!: ()", e AS "Mixed Case""#;

        let command = command(sql, &[]).unwrap();

        assert_eq!(command, r#"SELECT a AS "amount", b AS "token", c AS "maybe", d AS "kept", e AS "Mixed Case""#);
    }

    #[test]
    fn the_project_statements_convert_with_their_full_parameter_lists() {
        let accept = include_str!("../../shared/store/sql/accept.sql");
        let args: Vec<Arg<'_>> = (1..=17).map(|_| Arg::Var("v")).collect();

        let converted = command(accept, &args).unwrap();

        assert!(!converted.contains('$') && !converted.contains("--") && !converted.contains('\n'));
        assert!(converted.starts_with(r#"SELECT created AS "created", fingerprint AS "fingerprint""#), "{converted}");
        assert!(
            converted.ends_with("FROM intake(:v, :v, :v, :v, :v, :v, :v, :v, :v, :v, :v, :v, :v, :v, :v, :v, :v)"),
            "{converted}"
        );
        assert!(command(accept, &args[..16]).is_err(), "accept.sql has 17 parameters");
    }

    #[test]
    fn the_statements_of_query_macros_are_read_in_the_order_written() {
        let source = r###"
            use sqlx::query;
            let a = sqlx::query_as!(Row, r#"SELECT "x: X" FROM t WHERE a = $1"#, a).fetch_one(c).await?;
            sqlx::query!("UPDATE t SET b = $2 WHERE a = $1", a, b).execute(c).await?;
            let n = sqlx::query_scalar!(r##"SELECT 'a "#quote' AS "n!""##).fetch_one(c).await?;
            sqlx::query("SELECT 'checked at run time'").execute(c).await?;
        "###;

        let statements = macro_statements(source).unwrap();

        assert_eq!(
            statements,
            [
                r#"SELECT "x: X" FROM t WHERE a = $1"#,
                "UPDATE t SET b = $2 WHERE a = $1",
                r##"SELECT 'a "#quote' AS "n!""##
            ]
        );
    }

    #[test]
    fn a_query_macro_literal_with_an_escape_or_no_end_is_refused() {
        assert!(macro_statements(r#"sqlx::query!("SELECT '\n'")"#).is_err());
        assert!(macro_statements(r#"sqlx::query!("SELECT 1"#).is_err());
        assert!(macro_statements(r###"sqlx::query!(r#"SELECT 1")"###).is_err());
        assert!(macro_statements("sqlx::query!(QUERY)").is_err());
        assert!(macro_statements(r#"sqlx::query!(QUERY).execute(c).await?; let s = "SELECT 1";"#).is_err());
    }

    #[test]
    fn a_script_has_one_line_per_command() {
        let script =
            Script::new().set("key", "random(1, 10)").sql("SELECT :key".into()).sql_gset("SELECT 1 AS one".into());

        assert_eq!(script.text(), "\\set key random(1, 10)\nSELECT :key;\nSELECT 1 AS one \\gset\n");
    }
}
