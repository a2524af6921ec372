//! Splits SQL text into its statements at the semicolons that end them, as `psql` does: a
//! semicolon inside a quoted string, a quoted name, a dollar-quoted body or a comment ends nothing.
//!
//! `db::migrate` needs it on Citus, where a migration has to be sent one statement at a time.

/// The statements of `sql`, each from its first word to its closing semicolon. Comments before a
/// statement are left out; text that holds only comments and whitespace is no statement.
pub fn split(sql: &str) -> Vec<&str> {
    let bytes = sql.as_bytes();
    let mut statements = Vec::new();
    // Where the current statement starts, once its first word is seen.
    let mut start = None;
    let mut i = 0;
    while i < bytes.len() {
        let next = bytes.get(i + 1).copied();
        match bytes[i] {
            c if c.is_ascii_whitespace() => i += 1,
            b'-' if next == Some(b'-') => i = find(bytes, i, b"\n").map_or(bytes.len(), |end| end + 1),
            b'/' if next == Some(b'*') => i = block_comment_end(bytes, i),
            c => {
                let first = *start.get_or_insert(i);
                i = match c {
                    b'\'' => string_end(bytes, i, escapes_backslashes(bytes, i)) + 1,
                    b'"' => name_end(bytes, i) + 1,
                    b'$' => match dollar_tag(bytes, i) {
                        Some(tag) => find(bytes, i + tag.len(), tag).map_or(bytes.len(), |end| end + tag.len()),
                        None => i + 1,
                    },
                    b';' => {
                        statements.push(sql[first..=i].trim_end());
                        start = None;
                        i + 1
                    }
                    _ => i + 1,
                };
            }
        }
    }
    if let Some(first) = start {
        statements.push(sql[first..].trim_end());
    }
    statements
}

/// Where `needle` next occurs in `bytes` at or after `from`.
fn find(bytes: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    bytes.get(from..)?.windows(needle.len()).position(|window| window == needle).map(|at| from + at)
}

/// The index just past the block comment opening at `open` (they nest), or the end of the text.
fn block_comment_end(bytes: &[u8], open: usize) -> usize {
    let mut depth = 0;
    let mut i = open;
    while i + 1 < bytes.len() {
        match (bytes[i], bytes[i + 1]) {
            (b'/', b'*') => {
                depth += 1;
                i += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    bytes.len()
}

/// Whether the string opening at `quote` is an escape string (`E'…'`), where a backslash escapes
/// the next character.
fn escapes_backslashes(bytes: &[u8], quote: usize) -> bool {
    quote >= 1
        && matches!(bytes[quote - 1], b'E' | b'e')
        && (quote < 2 || !(bytes[quote - 2].is_ascii_alphanumeric() || bytes[quote - 2] == b'_'))
}

/// The index of the quote that closes the string opening at `open`, or the last index.
fn string_end(bytes: &[u8], open: usize, backslashes: bool) -> usize {
    let mut i = open + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if backslashes => i += 2,
            b'\'' if bytes.get(i + 1) == Some(&b'\'') => i += 2,
            b'\'' => return i,
            _ => i += 1,
        }
    }
    bytes.len() - 1
}

/// The index of the `"` that closes the quoted name opening at `open` (a doubled one is part of
/// the name), or the last index.
fn name_end(bytes: &[u8], open: usize) -> usize {
    let mut i = open + 1;
    while i < bytes.len() {
        if bytes[i] == b'"' {
            if bytes.get(i + 1) == Some(&b'"') {
                i += 2;
                continue;
            }
            return i;
        }
        i += 1;
    }
    bytes.len() - 1
}

/// The dollar-quote tag (`$$` or `$name$`) opening at `at`, if one does. `$1` is a parameter, and a
/// `$` inside a name (`a$b`) opens nothing.
fn dollar_tag(bytes: &[u8], at: usize) -> Option<&[u8]> {
    if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
        return None;
    }
    let mut end = at + 1;
    while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
        end += 1;
    }
    let name = &bytes[at + 1..end];
    let starts_right = name.first().is_none_or(|c| !c.is_ascii_digit());
    (starts_right && bytes.get(end) == Some(&b'$')).then(|| &bytes[at..=end])
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn statements_end_at_their_semicolons() {
        let sql = "CREATE TABLE a (x int);\n\nALTER TABLE a ADD COLUMN y int;\nUPDATE a SET y = x";

        assert_eq!(split(sql), ["CREATE TABLE a (x int);", "ALTER TABLE a ADD COLUMN y int;", "UPDATE a SET y = x"]);
    }

    #[test]
    fn a_function_body_is_one_statement_whatever_it_holds() {
        let sql = "CREATE FUNCTION f() RETURNS void LANGUAGE plpgsql AS $$\nBEGIN\n  PERFORM 1;\n  \
                   EXECUTE $q$SELECT ';'$q$;\nEND\n$$;\nDO $body$ BEGIN PERFORM $1; END $body$;";

        let statements = split(sql);

        assert_eq!(statements.len(), 2, "{statements:#?}");
        assert!(statements[0].ends_with("END\n$$;"));
        assert_eq!(statements[1], "DO $body$ BEGIN PERFORM $1; END $body$;");
    }

    #[test]
    fn semicolons_in_strings_names_and_comments_end_nothing() {
        let sql = "SELECT 'a;''b', E'c\\';d', \"odd;\"\"name\" -- a comment; with 'a quote\n\
                   FROM t /* a; /* nested; */ comment */ WHERE x = 1;";

        assert_eq!(split(sql), [sql]);
    }

    #[test]
    fn comments_and_whitespace_alone_are_no_statement() {
        let sql = "-- Why this migration exists.\n\nSELECT 1;\n\n-- The end.\n/* really */\n";

        assert_eq!(split(sql), ["SELECT 1;"]);
    }

    #[test]
    fn a_name_ending_in_e_does_not_make_an_escape_string() {
        let sql = "SELECT name'a\\';SELECT 2;";

        assert_eq!(split(sql), ["SELECT name'a\\';", "SELECT 2;"]);
    }

    /// Statements that each hold something a naive split would cut.
    const TRICKY: [&str; 6] = [
        "INSERT INTO t VALUES ('x;y', 'it''s');",
        "CREATE FUNCTION g() RETURNS int LANGUAGE sql AS $$ SELECT 1; $$;",
        "SELECT $tag$ a $$ b; $tag$;",
        "SELECT \"a;b\" FROM \"c\"\"d\";",
        "SELECT 1 /* ; */;",
        "SELECT E'\\';';",
    ];

    proptest! {
        #[test]
        fn statements_joined_in_any_order_split_back_into_themselves(
            picks in proptest::collection::vec(0..TRICKY.len(), 0..12),
            separator in prop_oneof![Just("\n"), Just(" "), Just("\n-- between; 'x\n"), Just("\n\n")],
        ) {
            let statements: Vec<&str> = picks.iter().map(|&i| TRICKY[i]).collect();

            let sql = statements.join(separator);

            prop_assert_eq!(split(&sql), statements);
        }
    }
}
