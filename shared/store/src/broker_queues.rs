//! What the api's broker consumers last saw of RabbitMQ's queues: the intake queue's depth, and the
//! dead-letter queue's size and when its oldest message was refused
//! (`migrations/0450_broker_queue_samples.sql`). The api writes; the console reads.

use sqlx::PgConnection;
use time::OffsetDateTime;

use crate::StoreError;

/// Which queue a sample is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// The queue producers publish payment requests to.
    Payments,
    /// The messages that will never be payments.
    DeadLetters,
}

impl Queue {
    /// Its name in the table (and in the api's gauge's `queue` label).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Payments => "payments",
            Self::DeadLetters => "dead_letters",
        }
    }
}

/// One queue as last sampled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSample {
    /// `payments` or `dead_letters`.
    pub queue: String,
    /// Messages in it (ready ones; those a consumer holds are not counted).
    pub messages: i64,
    /// For the dead letters, when the oldest was refused, if known.
    pub oldest_failed_at: Option<OffsetDateTime>,
    /// When it was sampled.
    pub sampled_at: OffsetDateTime,
}

/// Records a sample of `queue` taken at `sampled_at`, unless a later one is recorded already
/// (several api processes sample the same queues).
pub async fn record(
    conn: &mut PgConnection,
    queue: Queue,
    messages: i64,
    oldest_failed_at: Option<OffsetDateTime>,
    sampled_at: OffsetDateTime,
) -> Result<(), StoreError> {
    sqlx::query!(
        r#"
        INSERT INTO broker_queue_samples AS s (queue, messages, oldest_failed_at, sampled_at)
        VALUES ($1, $2, $3, $4)
        ON CONFLICT (queue) DO UPDATE
            SET messages = excluded.messages, oldest_failed_at = excluded.oldest_failed_at,
                sampled_at = excluded.sampled_at
            WHERE s.sampled_at < excluded.sampled_at
        "#,
        queue.as_str(),
        messages,
        oldest_failed_at,
        sampled_at,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Every queue's last sample (none when no api consumes a broker).
pub async fn latest(conn: &mut PgConnection) -> Result<Vec<QueueSample>, StoreError> {
    Ok(sqlx::query_as!(
        QueueSample,
        "SELECT queue, messages, oldest_failed_at, sampled_at FROM broker_queue_samples ORDER BY queue DESC"
    )
    .fetch_all(conn)
    .await?)
}
