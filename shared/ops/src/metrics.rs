//! The operators' metrics: sign-ins held back and password hashing. Their names keep the
//! reconciler's prefix, the process that serves the operations API.

use metrics::{counter, describe_counter, describe_gauge};

/// Sign-ins (with a password or at the OpenID provider) and enrollments refused before any check,
/// by `why`: `source` (too many from one address), `locked` (too many refusals of the name),
/// `busy` (the name is being checked by another request).
pub const SIGN_INS_HELD_BACK: &str = "oncepay_reconciler_sign_ins_held_back_total";
/// Password checks refused because the process already runs as many hashes as it may.
pub const PASSWORD_CHECKS_REFUSED: &str = "oncepay_reconciler_password_checks_refused_total";
/// Password hashes running now in this process.
pub const PASSWORD_HASHES_RUNNING: &str = "oncepay_reconciler_password_hashes_running";
/// Every `why` of [`SIGN_INS_HELD_BACK`].
pub const HELD_BACK: [&str; 3] = ["source", "locked", "busy"];

/// Describes the operators' metrics and registers every counter series at zero.
pub fn describe() {
    describe_counter!(SIGN_INS_HELD_BACK, "Sign-ins and enrollments refused before any check, by why");
    describe_counter!(PASSWORD_CHECKS_REFUSED, "Password checks refused: the process ran as many hashes as it may");
    describe_gauge!(PASSWORD_HASHES_RUNNING, "Password hashes running now in this process");
    for why in HELD_BACK {
        counter!(SIGN_INS_HELD_BACK, "why" => why).increment(0);
    }
    counter!(PASSWORD_CHECKS_REFUSED).increment(0);
}
