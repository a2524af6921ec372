//! The limits on signing in (with a password, at the OpenID provider, or with an enrollment code),
//! kept in `sign_in_limits`: one row per source address and per name, read by its key, so a check
//! costs the same however many refusals came before.
//!
//! A source (an IPv4 address, or an IPv6 address by its /64, which one holder usually has whole)
//! gets `source_attempts` attempts per window: each attempt is taken before it is checked, in one
//! statement, so parallel attempts cannot all pass, and given back when it succeeds. A name gets
//! `attempts` refusals per window; its checks run one at a time ([`hold_name`]), so parallel guesses
//! do not each get a check. Past either limit, nothing is checked and the lock is written to the
//! audit trail once per window: unauthenticated requests add a bounded number of rows.
//!
//! Rows whose window has passed count as none and are deleted as new ones are written.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::Context as _;
use sqlx::PgConnection;

use crate::operator_error::OperatorError;

/// The limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Refusals of one name that lock it …
    pub attempts: u32,
    /// … attempts from one source that lock it …
    pub source_attempts: u32,
    /// … within this window.
    pub window: Duration,
}

/// What an attempt from a source may do.
#[derive(Debug, PartialEq, Eq)]
pub enum Source {
    /// Go on: the attempt is taken, and given back if it succeeds.
    Taken,
    /// Nothing more this window; `note` is true the first time, when the lock is to be recorded.
    Exhausted {
        /// Whether to record the lock in the audit trail.
        note: bool,
    },
}

/// The key of a request's source address: IPv4 whole, IPv6 by its /64; `None` without one.
pub fn source_subject(source: Option<&str>) -> Option<String> {
    let address: IpAddr = source?.parse().ok()?;
    Some(match address {
        IpAddr::V4(v4) => format!("source:{v4}"),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => format!("source:{v4}"),
            None => {
                let s = v6.segments();
                format!("source:{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
    })
}

/// The key of a name as typed: the name when it could be an operator's, one shared key for all that
/// could not (none of them is anyone's, so locking them together locks nobody out).
pub fn name_subject(name: &str) -> String {
    match super::OperatorName::parse(name) {
        Ok(name) => format!("name:{name}"),
        Err(_) => "name:(not a name)".to_owned(),
    }
}

/// Takes one attempt from `subject`'s allowance. Atomic: parallel attempts each see their own count.
pub async fn take_source(conn: &mut PgConnection, subject: &str, limits: &Limits) -> Result<Source, OperatorError> {
    forget_old(conn, limits).await?;
    let taken = sqlx::query_scalar!(
        r#"
        INSERT INTO sign_in_limits AS l (subject, refusals) VALUES ($1, 1)
        ON CONFLICT (subject) DO UPDATE SET
            refusals = CASE WHEN l.window_start <= now() - make_interval(secs => $2) THEN 1
                            ELSE LEAST(l.refusals + 1, 1000000) END,
            locked_noted = l.locked_noted AND l.window_start > now() - make_interval(secs => $2),
            window_start = CASE WHEN l.window_start <= now() - make_interval(secs => $2) THEN now()
                                ELSE l.window_start END
        RETURNING refusals
        "#,
        subject,
        limits.window.as_secs_f64(),
    )
    .fetch_one(&mut *conn)
    .await
    .context("cannot count the sign-in attempts")?;
    if taken <= i32::try_from(limits.source_attempts).unwrap_or(i32::MAX) {
        return Ok(Source::Taken);
    }
    Ok(Source::Exhausted { note: note_lock(conn, subject).await? })
}

/// Gives back an attempt taken from `subject` that succeeded.
pub async fn give_back(conn: &mut PgConnection, subject: &str) -> Result<(), OperatorError> {
    sqlx::query!("UPDATE sign_in_limits SET refusals = refusals - 1 WHERE subject = $1 AND refusals > 0", subject)
        .execute(conn)
        .await
        .context("cannot count the sign-in attempts")?;
    Ok(())
}

/// Holds the checks of name `subject` for the caller's transaction: `false` when another request
/// checks it now, and this one must not.
pub async fn hold_name(conn: &mut PgConnection, subject: &str) -> Result<bool, OperatorError> {
    let held = sqlx::query_scalar!(
        r#"SELECT pg_try_advisory_xact_lock(hashtextextended('oncepay.sign_in.' || $1, 0)) AS "held!""#,
        subject,
    )
    .fetch_one(conn)
    .await
    .context("cannot hold the sign-in checks of a name")?;
    Ok(held)
}

/// Whether name `subject` is locked by its refusals in this window (its checks held by the caller).
pub async fn name_locked(conn: &mut PgConnection, subject: &str, limits: &Limits) -> Result<bool, OperatorError> {
    let refusals = sqlx::query_scalar!(
        "SELECT refusals FROM sign_in_limits WHERE subject = $1 AND window_start > now() - make_interval(secs => $2)",
        subject,
        limits.window.as_secs_f64(),
    )
    .fetch_optional(conn)
    .await
    .context("cannot read the sign-in refusals")?;
    Ok(refusals.is_some_and(|n| n >= i32::try_from(limits.attempts).unwrap_or(i32::MAX)))
}

/// Counts a refusal of name `subject`.
pub async fn refuse_name(conn: &mut PgConnection, subject: &str, limits: &Limits) -> Result<(), OperatorError> {
    forget_old(conn, limits).await?;
    sqlx::query!(
        r#"
        INSERT INTO sign_in_limits AS l (subject, refusals) VALUES ($1, 1)
        ON CONFLICT (subject) DO UPDATE SET
            refusals = CASE WHEN l.window_start <= now() - make_interval(secs => $2) THEN 1
                            ELSE LEAST(l.refusals + 1, 1000000) END,
            locked_noted = l.locked_noted AND l.window_start > now() - make_interval(secs => $2),
            window_start = CASE WHEN l.window_start <= now() - make_interval(secs => $2) THEN now()
                                ELSE l.window_start END
        "#,
        subject,
        limits.window.as_secs_f64(),
    )
    .execute(conn)
    .await
    .context("cannot count the sign-in refusals")?;
    Ok(())
}

/// Forgets the refusals of name `subject` after it signed in.
pub async fn forgive_name(conn: &mut PgConnection, subject: &str) -> Result<(), OperatorError> {
    sqlx::query!("DELETE FROM sign_in_limits WHERE subject = $1", subject)
        .execute(conn)
        .await
        .context("cannot reset the sign-in refusals")?;
    Ok(())
}

/// Marks `subject`'s lock as recorded; `true` the first time this window.
pub async fn note_lock(conn: &mut PgConnection, subject: &str) -> Result<bool, OperatorError> {
    let noted = sqlx::query!(
        "UPDATE sign_in_limits SET locked_noted = true WHERE subject = $1 AND NOT locked_noted RETURNING subject",
        subject,
    )
    .fetch_optional(conn)
    .await
    .context("cannot note the sign-in lock")?;
    Ok(noted.is_some())
}

/// Deletes the rows whose window has passed: they count as none anyway.
async fn forget_old(conn: &mut PgConnection, limits: &Limits) -> Result<(), OperatorError> {
    sqlx::query!(
        "DELETE FROM sign_in_limits WHERE window_start <= now() - make_interval(secs => $1)",
        limits.window.as_secs_f64(),
    )
    .execute(conn)
    .await
    .context("cannot forget old sign-in limits")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_source_counts_by_its_64_and_a_mapped_ipv4_as_ipv4() {
        assert_eq!(source_subject(Some("192.0.2.7")).unwrap(), "source:192.0.2.7");
        assert_eq!(source_subject(Some("2001:db8:1:2:aaaa::1")).unwrap(), "source:2001:db8:1:2::/64");
        assert_eq!(source_subject(Some("2001:db8:1:2:bbbb::9")).unwrap(), "source:2001:db8:1:2::/64");
        assert_eq!(source_subject(Some("::ffff:192.0.2.7")).unwrap(), "source:192.0.2.7");
        assert_eq!(source_subject(None), None);
    }

    #[test]
    fn names_that_cannot_be_anyones_share_one_key() {
        assert_eq!(name_subject("alice"), "name:alice");
        assert_eq!(name_subject("Robert'); DROP"), name_subject("nobody at all"));
    }
}
