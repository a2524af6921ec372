//! The PostgreSQL `LISTEN/NOTIFY` channels oncepay uses to wake processes instead of polling.
//!
//! A notification is only a hint: listeners always re-read the database, and every loop that
//! waits on one also polls on a timer, so a lost notification (a dropped listener connection)
//! delays work but never loses it. The channel names are repeated as literals in the SQL that
//! sends them; the tests that wait on them keep the two in step.

/// New or re-queued outbox rows: wakes the workers. Payload: empty.
pub const OUTBOX_CHANNEL: &str = "oncepay_outbox";

/// A payment changed status: wakes long polls. Payload: the payment id.
pub const PAYMENT_CHANNEL: &str = "oncepay_payment";
