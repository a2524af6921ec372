//! What the store's test crates share.

use std::time::Duration;

use oncepay_devkit::wait::wait_until;
use sqlx::{PgConnection, PgPool};

/// The backend of `holder` blocks another backend.
pub async fn blocks_another(pool: &PgPool, holder: &mut PgConnection) {
    let pid = sqlx::query_scalar!(r#"SELECT pg_backend_pid() AS "pid!""#).fetch_one(&mut *holder).await.unwrap();
    wait_until("another backend to wait for the holder", Duration::from_secs(10), || async {
        sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))) AS "blocked!""#,
            pid
        )
        .fetch_one(pool)
        .await
        .unwrap()
        .then_some(())
    })
    .await
    .unwrap();
}
