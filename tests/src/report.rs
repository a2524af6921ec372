//! The report of a run: the seed, the faults injected by kind, the requests sent and accepted, the
//! charge histogram, how often the resend guards held a send back, the events sent to merchants and
//! how their receiver responded, the violations (expected: none), and time to terminal
//! (p50/p99/max). It is printed by the harness and by a failing test, so
//! everything needed to reproduce and diagnose a run is in it. It formats; it judges nothing beyond counting what the checker found.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::broker::BrokerVerdict;
use crate::checker::{Settled, Verdict};
use crate::events::EventsVerdict;
use crate::system::Topology;
use crate::workload::{MisuseOutcome, Observations, ProbeOutcome};

/// Everything a run found.
#[derive(Debug)]
pub struct Report {
    /// What ran.
    pub title: String,
    /// The one seed.
    pub seed: u64,
    /// How long faults were injected.
    pub span: Duration,
    /// Processes.
    pub topology: Topology,
    /// Tenants.
    pub tenants: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Intents sent as duplicate storms.
    pub plan_storms: usize,
    /// What the clients saw.
    pub observations: Observations,
    /// How settling went.
    pub settled: Settled,
    /// What the checker found.
    pub verdict: Verdict,
    /// Under Citus, the transactions that committed with two-phase commit during the run: each one
    /// spanned nodes, which no statement of oncepay should make. `None` on one PostgreSQL.
    pub two_phase_commits: Option<i64>,
    /// The broker's part, when part of the workload was published to RabbitMQ (its violations are
    /// in the verdict's).
    pub broker: Option<BrokerVerdict>,
    /// The events' part, when the run subscribed a receiver (its violations are in the verdict's).
    pub events: Option<EventsVerdict>,
}

impl Report {
    /// No violation, nothing left in flight, and under Citus no transaction that spanned nodes.
    pub fn passed(&self) -> bool {
        self.verdict.violations.is_empty() && self.settled.stuck.is_empty() && self.two_phase_commits.unwrap_or(0) == 0
    }
}

fn secs(duration: Option<Duration>) -> String {
    duration.map_or_else(|| "-".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.observations;
        let v = &self.verdict;
        writeln!(f, "== {} ==", self.title)?;
        writeln!(f, "seed             {} (reproduce with --seed {})", self.seed, self.seed)?;
        writeln!(
            f,
            "system           {} api, {} worker, {} reconciler; {} tenants; faults for {} s",
            self.topology.apis,
            self.topology.workers,
            self.topology.reconcilers,
            self.tenants,
            self.span.as_secs()
        )?;
        writeln!(f, "faults injected")?;
        if self.faults.is_empty() {
            writeln!(f, "  none")?;
        }
        for (kind, count) in &self.faults {
            writeln!(f, "  {count:>6}  {kind}")?;
        }
        let intents = o.intents.len();
        let replayed: u32 = o.intents.values().map(|r| r.replayed).sum();
        let gave_up: u32 = o.intents.values().map(|r| r.gave_up).sum();
        let misuses: Vec<_> = o.intents.values().filter_map(|r| r.misuse.as_ref()).collect();
        let refused = misuses.iter().filter(|m| **m == &MisuseOutcome::Rejected).count();
        let not_found = o.probes.iter().filter(|p| p.outcome == ProbeOutcome::NotFound).count();
        writeln!(
            f,
            "requests         {} creates sent for {intents} intents ({} storms); {} accepted, {replayed} answers replayed, \
             {gave_up} sends without an answer",
            o.sends(),
            self.plan_storms,
            o.accepted(),
        )?;
        writeln!(
            f,
            "misuse, tenancy  {} key misuses ({refused} refused with 422); {} cross-tenant reads ({not_found} answered 404)",
            misuses.len(),
            o.probes.len(),
        )?;
        if let Some(b) = &self.broker {
            let reasons: Vec<String> = b.dead_letters.iter().map(|(reason, n)| format!("{reason} {n}")).collect();
            writeln!(
                f,
                "broker           {} intents published ({} confirmed; {} messages, {} published again without a \
                 confirm, {} never confirmed); {} payments, {} replies replayed; dead letters: {}; {} left in flight",
                b.intents,
                b.confirmed,
                b.messages,
                b.republished,
                b.unconfirmed,
                b.payments,
                b.replayed,
                if reasons.is_empty() { "none".to_owned() } else { reasons.join(", ") },
                b.in_flight
            )?;
        }
        let statuses: Vec<String> = v.by_status.iter().map(|(status, n)| format!("{status} {n}")).collect();
        writeln!(f, "payments         {} ({})", v.payments, statuses.join(", "))?;
        writeln!(
            f,
            "intake groups    {} payments accepted in a transaction shared with others; at most {} in one",
            v.accepted_together, v.largest_group
        )?;
        writeln!(
            f,
            "charges          {} at the provider; payments with 0 / 1 / 2+ charges: {} / {} / {}",
            v.provider_charges, v.charge_histogram[0], v.charge_histogram[1], v.charge_histogram[2]
        )?;
        let refunds: Vec<String> = v.refunds.by_status.iter().map(|(status, n)| format!("{status} {n}")).collect();
        writeln!(
            f,
            "refunds          {} for {} refund intents ({}); {} at the provider; {} refused as more than was left; \
             {} conflict(s) on final refunds ({} false)",
            v.refunds.refunds,
            o.refunds.len(),
            refunds.join(", "),
            v.refunds.provider_refunds,
            v.refunds.refused_too_much,
            v.refunds.conflicts,
            v.refunds.false_conflicts.len()
        )?;
        writeln!(
            f,
            "resend guards    {} payment and {} refund resend(s) held back past the key window",
            v.held_back, v.refunds.held_back
        )?;
        if let Some(e) = &self.events {
            let kinds: Vec<String> = e.events.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
            let disabled: Vec<String> = e.disabled.iter().map(|(name, reason)| format!("{name} ({reason})")).collect();
            writeln!(
                f,
                "events           {} written ({}); deliveries: {} delivered, {} dead-lettered, {} pending at disabled \
                 endpoints [{}], {} owed to enabled ones; {} claims ended without a recorded attempt",
                e.events.values().sum::<usize>(),
                kinds.join(", "),
                e.delivered,
                e.dead_lettered,
                e.pending_at_disabled,
                disabled.join(", "),
                e.owed,
                e.interrupted
            )?;
            let requests: Vec<String> = e.requests.iter().map(|(behaviour, n)| format!("{behaviour} {n}")).collect();
            writeln!(
                f,
                "receiver         {} requests ({}); {} for an event already taken; {} refused as unverified",
                e.requests.values().sum::<usize>(),
                requests.join(", "),
                e.repeated,
                e.refused
            )?;
        }
        writeln!(
            f,
            "time to terminal p50 {}, p99 {}, max {} (acceptance to succeeded/failed/dead-lettered)",
            secs(v.latency(0.5)),
            secs(v.latency(0.99)),
            secs(v.time_to_terminal.last().copied())
        )?;
        if self.settled.stuck.is_empty() {
            writeln!(f, "settled          in {:.1} s after healing", self.settled.waited.as_secs_f64())?;
        } else {
            writeln!(
                f,
                "settled          NO: {} payment(s) still in flight after {} s",
                self.settled.stuck.len(),
                self.settled.waited.as_secs()
            )?;
            for stuck in self.settled.stuck.iter().take(20) {
                writeln!(f, "  {} {}: {}", stuck.payment_id, stuck.status, stuck.detail)?;
            }
        }
        if let Some(spanning) = self.two_phase_commits {
            writeln!(f, "Citus            {spanning} transaction(s) committed with two-phase commit (must be 0)")?;
        }
        writeln!(f, "violations       {}", v.violations.len())?;
        for violation in v.violations.iter().take(50) {
            writeln!(f, "  {violation}")?;
        }
        if v.violations.len() > 50 {
            writeln!(f, "  ... and {} more", v.violations.len() - 50)?;
        }
        if let Some((payment_id, reason)) = v.false_conflicts.first() {
            writeln!(
                f,
                "false conflicts  {} conflict dead letter(s) on payments that agree with the provider and the ledger, \
                 e.g. {payment_id}: {reason}",
                v.false_conflicts.len()
            )?;
        }
        if let Some((refund_id, reason)) = v.refunds.false_conflicts.first() {
            writeln!(
                f,
                "false conflicts  {} conflict(s) on refunds that agree with the provider, e.g. {refund_id}: {reason}",
                v.refunds.false_conflicts.len()
            )?;
        }
        if !v.notes.is_empty() {
            writeln!(f, "notes")?;
            for note in v.notes.iter().take(20) {
                writeln!(f, "  {note}")?;
            }
            if v.notes.len() > 20 {
                writeln!(f, "  ... and {} more", v.notes.len() - 20)?;
            }
        }
        writeln!(f, "result           {}", if self.passed() { "PASS" } else { "FAIL" })
    }
}
