//! The fault schedule: which faults the harness injects, and when, drawn from one seed.
//!
//! [`Schedule::draw`] lays out process faults and simulator phases over the run's span;
//! [`FailPointDraw`] picks, for each worker start, which of the worker's crash points to arm. In a
//! drawn schedule one target has at most one fault at a time, and PostgreSQL is never down while a
//! process is. This module draws; it never injects.

use std::collections::BTreeMap;
use std::time::Duration;

use oncepay_simulator::faults::FaultsPatch;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::system::Role;

/// One thing to do to the system.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// SIGKILL.
    Kill(Role, usize),
    /// Start it again (with a fresh fail-point draw for a worker).
    Restart(Role, usize),
    /// SIGSTOP.
    Pause(Role, usize),
    /// SIGCONT.
    Resume(Role, usize),
    /// `pg_ctl stop -m immediate`.
    CrashDatabase,
    /// Start PostgreSQL again.
    ResumeDatabase,
    /// Under Citus, `pg_ctl stop -m immediate` of one worker node (the coordinator stays up).
    StopDatabaseNode(usize),
    /// Start that worker node again.
    StartDatabaseNode(usize),
    /// A new mix of simulator faults.
    SimulatorFaults(Box<FaultsPatch>),
    /// Stop the RabbitMQ node cleanly (`rabbitmqctl stop`).
    StopBroker,
    /// Start it again.
    StartBroker,
    /// Close every connection to it (`rabbitmqctl close_all_connections`).
    CutBrokerConnections,
}

impl Action {
    /// The fault this action injects, for the report; none for an action that ends one.
    pub fn kind(&self) -> Option<String> {
        match self {
            Self::Kill(role, _) => Some(format!("SIGKILL {} + restart", role.as_str())),
            Self::Pause(role, _) => Some(format!("SIGSTOP {} past its lease + SIGCONT", role.as_str())),
            Self::CrashDatabase => Some("PostgreSQL stop -m immediate + restart".to_owned()),
            Self::StopDatabaseNode(_) => Some("Citus worker node stop -m immediate + restart".to_owned()),
            Self::SimulatorFaults(_) => Some("simulator fault phases".to_owned()),
            Self::StopBroker => Some("RabbitMQ node stop + start".to_owned()),
            Self::CutBrokerConnections => Some("RabbitMQ connections cut".to_owned()),
            Self::Restart(..)
            | Self::Resume(..)
            | Self::ResumeDatabase
            | Self::StartDatabaseNode(_)
            | Self::StartBroker => None,
        }
    }
}

/// An action at a moment of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Scheduled {
    /// From the beginning of the run.
    pub at: Duration,
    /// What to do.
    pub action: Action,
}

/// How intense the faults are.
#[derive(Debug, Clone, Copy)]
pub struct Intensity {
    /// Mean time between two process faults.
    pub process_fault_every: Duration,
    /// How long one simulator phase lasts.
    pub simulator_phase: Duration,
    /// The worker's lease: a pause lasts longer than this.
    pub lease: Duration,
    /// With a broker, the mean time between two broker faults.
    pub broker_fault_every: Option<Duration>,
}

/// Every action of a run, in time order.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Sorted by `at`.
    pub actions: Vec<Scheduled>,
}

impl Schedule {
    /// Draws the faults for a run of `span` on the processes `counts` names: SIGKILL then restart
    /// of a worker, a reconciler or an api; SIGSTOP of a worker past its lease then SIGCONT;
    /// PostgreSQL stopped with `-m immediate` then started; and a new mix of simulator faults every
    /// `intensity.simulator_phase`. Under Citus (`database_nodes` worker nodes, 0 on one PostgreSQL)
    /// the database faults take turns between the coordinator and each worker node, and a run has
    /// at least one of each kind.
    ///
    /// Forgotten keys are not a scheduled event: the simulator and oncepay run with a short key
    /// window (see `system::Timing`), so keys really expire during a run, as at a real provider.
    pub fn draw(
        seed: u64,
        span: Duration,
        intensity: Intensity,
        counts: &BTreeMap<Role, usize>,
        database_nodes: usize,
    ) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0xFA17_5EED);
        let mut actions = Vec::new();

        // Process faults: each target busy for one fault at a time; PostgreSQL crashes never overlap
        // a process being down, since a restart needs the database to become ready.
        let mut busy_until: BTreeMap<(Role, usize), Duration> = BTreeMap::new();
        let mut down: Vec<(Duration, Duration)> = Vec::new();
        let mut database_down: Vec<(Duration, Duration)> = Vec::new();
        let overlaps = |windows: &[(Duration, Duration)], from: Duration, to: Duration| {
            windows.iter().any(|(start, end)| from < *end && *start < to)
        };
        let mean = intensity.process_fault_every.as_secs_f64().max(0.5);
        let mut at = Duration::from_secs_f64(rng.random_range(0.5..1.5) * mean);
        // Leave the last stretch calm enough for restarts to finish inside the span.
        let last = span.saturating_sub(Duration::from_secs(5));
        // The first rounds inject one fault of every kind, in a drawn order (a kind that does not fit
        // is tried again at the next round), so that even a short run has them all; the rest are
        // drawn by weight.
        let mut required = vec![0, 40, 60, 80, 95];
        for i in (1..required.len()).rev() {
            required.swap(i, rng.random_range(0..=i));
        }
        let mut required: std::collections::VecDeque<u32> = required.into();
        if database_nodes > 0 {
            // The second database fault is the first one of a worker node.
            required.push_back(95);
        }
        let mut database_faults = 0;
        while at < last {
            let from_required = required.pop_front();
            let roll = from_required.unwrap_or_else(|| rng.random_range(0..100));
            let (role, kind) = match roll {
                0..35 => (Role::Worker, "kill"),
                35..55 => (Role::Worker, "pause"),
                55..72 => (Role::Reconciler, "kill"),
                72..85 => (Role::Api, "kill"),
                _ => (Role::Worker, "database"),
            };
            let count = counts.get(&role).copied().unwrap_or(0);
            let mut scheduled = false;
            if kind == "database" {
                let length = Duration::from_millis(rng.random_range(800..4_000));
                if !overlaps(&down, at, at + length) && !overlaps(&database_down, at, at + length) {
                    database_down.push((at, at + length));
                    let (stop, start) = match database_faults % (database_nodes + 1) {
                        0 => (Action::CrashDatabase, Action::ResumeDatabase),
                        node => (Action::StopDatabaseNode(node - 1), Action::StartDatabaseNode(node - 1)),
                    };
                    database_faults += 1;
                    actions.push(Scheduled { at, action: stop });
                    actions.push(Scheduled { at: at + length, action: start });
                    scheduled = true;
                }
            } else if count > 0 {
                let index = rng.random_range(0..count);
                let free = busy_until.get(&(role, index)).is_none_or(|until| *until <= at);
                if kind == "pause" {
                    // Past the lease, so the sweeper hands its payments to another worker meanwhile.
                    let length = intensity.lease + Duration::from_millis(rng.random_range(500..4_000));
                    if free {
                        busy_until.insert((role, index), at + length);
                        actions.push(Scheduled { at, action: Action::Pause(role, index) });
                        actions.push(Scheduled { at: at + length, action: Action::Resume(role, index) });
                        scheduled = true;
                    }
                } else {
                    let length = Duration::from_millis(rng.random_range(300..3_000));
                    if free && !overlaps(&database_down, at, at + length + Duration::from_secs(2)) {
                        // The restart itself takes a moment: keep PostgreSQL up through it.
                        busy_until.insert((role, index), at + length + Duration::from_secs(2));
                        down.push((at, at + length + Duration::from_secs(2)));
                        actions.push(Scheduled { at, action: Action::Kill(role, index) });
                        actions.push(Scheduled { at: at + length, action: Action::Restart(role, index) });
                        scheduled = true;
                    }
                }
            }
            if let (Some(roll), false) = (from_required, scheduled) {
                required.push_front(roll);
            }
            at += Duration::from_secs_f64(rng.random_range(0.3..1.7) * mean);
        }

        if let Some(every) = intensity.broker_fault_every {
            actions.extend(broker_faults(seed, last, every));
        }

        // Simulator phases over the whole span.
        let mut at = Duration::ZERO;
        while at < span {
            let faults = simulator_phase(&mut rng);
            actions.push(Scheduled { at, action: Action::SimulatorFaults(Box::new(faults)) });
            at += intensity.simulator_phase;
        }

        actions.sort_by_key(|scheduled| scheduled.at);
        Self { actions }
    }
}

/// The broker's faults over `span`, on a timeline of their own (they may overlap any other): the
/// node stopped for a few seconds then started, or every connection cut, in turns drawn by chance
/// after one of each.
fn broker_faults(seed: u64, span: Duration, every: Duration) -> Vec<Scheduled> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xB40_CE55);
    let mean = every.as_secs_f64().max(1.0);
    let mut actions = Vec::new();
    let mut stop_first = rng.random_bool(0.5);
    let mut at = Duration::from_secs_f64(rng.random_range(0.5..1.0) * mean);
    let mut drawn = 0;
    while at < span {
        let stop = if drawn < 2 { stop_first } else { rng.random_bool(0.5) };
        stop_first = !stop_first;
        drawn += 1;
        if stop {
            let length = Duration::from_millis(rng.random_range(1_000..4_000));
            actions.push(Scheduled { at, action: Action::StopBroker });
            actions.push(Scheduled { at: at + length, action: Action::StartBroker });
            at += length;
        } else {
            actions.push(Scheduled { at, action: Action::CutBrokerConnections });
        }
        at += Duration::from_secs_f64(rng.random_range(0.5..1.5) * mean);
    }
    actions
}

/// The share of new charges and refunds a phase reports malformed, at least, while the simulator
/// has malformed none yet in the run. The chaos test asserts that a run injected each kind of fault
/// it names. Drawn rates (at most 0.08, often 0) left a whole run without a malformed response now
/// and then, and so did two phases fixed in advance at this rate, when the workers charged little
/// in them (a database stopped, workers killed).
const MALFORMED_AT_LEAST: f64 = 0.25;

/// `phase`, malforming at least [`MALFORMED_AT_LEAST`] of new charges and refunds unless the
/// simulator has `malformed_yet`.
pub fn until_malformed(mut phase: FaultsPatch, malformed_yet: bool) -> FaultsPatch {
    if !malformed_yet {
        phase.malformed_rate = Some(phase.malformed_rate.unwrap_or(0.0).max(MALFORMED_AT_LEAST));
    }
    phase
}

/// One phase's simulator faults: sometimes calm, usually a mix of latency, declines, 5xx before and
/// after charging, hangs past the worker's timeout, charges made seconds after their request,
/// connections dropped after charging, replayed 5xx, 429s with a long `Retry-After`, a lookup API
/// that fails, charges of another amount, responses and webhooks that misreport a charge, and
/// resends of a charged key refused; webhooks are dropped, delayed, duplicated and reordered.
///
/// About one phase in three holds sends and then parks their resends: many charges and refunds are
/// made seconds after their request (the worker gives up, a lookup finds nothing, the send is queued
/// again), and many requests get a 429 whose `Retry-After` outlasts the key window. A resend parked
/// so is claimed when the provider has forgotten the key although the first send went through: the
/// moment the resend guards exist for, which the run's report counts. Without these phases the
/// short profile's hundred-odd refunds rarely met it.
fn simulator_phase(rng: &mut StdRng) -> FaultsPatch {
    if rng.random_bool(0.15) {
        return calm();
    }
    let held_then_parked = rng.random_bool(0.35);
    let (hang_before_rate, rate_limit_rate, retry_after) = if held_then_parked {
        (rng.random_range(0.3..0.6), rng.random_range(0.3..0.6), rng.random_range(25..40))
    } else {
        (rate(rng, 0.3), rate(rng, 0.3), rng.random_range(5..40))
    };
    let (error_after, hang_after, drop_after) = (rate(rng, 0.12), rate(rng, 0.08), rate(rng, 0.1));
    FaultsPatch {
        latency_ms: Some(rng.random_range(0..40)),
        decline_rate: Some(rate(rng, 0.25)),
        error_before_rate: Some(rate(rng, 0.1)),
        error_after_rate: Some(error_after),
        hang_after_rate: Some(hang_after),
        drop_after_rate: Some(drop_after),
        replay_stored_5xx: Some(rng.random_bool(0.5)),
        webhook_drop_rate: Some(rng.random_range(0.0..0.6)),
        webhook_delay_ms: Some(rng.random_range(0..400)),
        webhook_duplicate_rate: Some(rng.random_range(0.0..0.5)),
        webhook_reorder: Some(rng.random_bool(0.4)),
        webhook_reorder_hold_ms: Some(rng.random_range(100..1_000)),
        // A long Retry-After parks a payment past the resend horizon: a payment queued again after
        // an uncertain send is then claimed when a resend could charge twice.
        rate_limit_rate: Some(rate_limit_rate),
        rate_limit_retry_after_secs: Some(retry_after),
        // A charge made seconds after its request: the worker gives up first, a lookup meanwhile
        // finds nothing and the payment is queued again, although the provider is about to charge.
        hang_before_rate: Some(hang_before_rate),
        hang_before_ms: Some(rng.random_range(3_000..15_000)),
        // Sometimes the lookup API is down for a whole phase, longer than the poller's attempts.
        lookup_error_rate: Some(if rng.random_bool(0.2) { 1.0 } else { rate(rng, 0.3) }),
        mismatch_rate: Some(rate(rng, 0.03)),
        malformed_rate: Some(rate(rng, 0.08)),
        // A resend of a charged key refused with a 400 (a payment method detached since): only a
        // lookup can show that the first send charged.
        refuse_resend_rate: Some(rate(rng, 0.5)),
        refund_failure_rate: Some(rate(rng, 0.25)),
        ..FaultsPatch::default()
    }
}

/// A rate in `[0, max)` more often than not, else 0.
fn rate(rng: &mut StdRng, max: f64) -> f64 {
    if rng.random_bool(0.6) { (rng.random_range(0.0..max) * 1000.0).round() / 1000.0 } else { 0.0 }
}

/// Every simulator fault off.
pub fn calm() -> FaultsPatch {
    FaultsPatch {
        latency_ms: Some(0),
        decline_rate: Some(0.0),
        error_before_rate: Some(0.0),
        error_after_rate: Some(0.0),
        hang_after_rate: Some(0.0),
        drop_after_rate: Some(0.0),
        replay_stored_5xx: Some(false),
        webhook_drop_rate: Some(0.0),
        webhook_delay_ms: Some(0),
        webhook_duplicate_rate: Some(0.0),
        webhook_reorder: Some(false),
        rate_limit_rate: Some(0.0),
        lookup_error_rate: Some(0.0),
        hang_before_rate: Some(0.0),
        mismatch_rate: Some(0.0),
        malformed_rate: Some(0.0),
        refuse_resend_rate: Some(0.0),
        refund_failure_rate: Some(0.0),
        ..FaultsPatch::default()
    }
}

/// The worker's crash points (`oncepay_service::failpoints`).
pub const WORKER_FAIL_POINTS: [&str; 3] = ["worker::after_claim", "worker::after_provider", "worker::after_record"];

/// The api's crash point, between a broker message's commit and its acknowledgement.
pub const API_FAIL_POINT: &str = "api::broker::after_commit";

/// Draws, for each worker start (and api start, with a broker), which fail point to arm.
#[derive(Debug)]
pub struct FailPointDraw {
    rng: StdRng,
    drawn: u32,
    apis_drawn: u32,
}

/// An armed fail point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Armed {
    /// The point.
    pub point: &'static str,
    /// `return` (the process exits) or `panic` (that task dies).
    pub action: &'static str,
    /// Evaluations that pass before it fires.
    pub after: u32,
}

impl Armed {
    /// The `FAILPOINTS` value.
    pub fn env(&self) -> String {
        // Fires once, after `after` quiet evaluations; then the point is off again.
        format!("{}={}*off->1*{}", self.point, self.after, self.action)
    }

    /// For the report.
    pub fn kind(&self) -> String {
        let effect = if self.action == "return" { "crash" } else { "panic" };
        format!("fail point {} ({effect})", self.point)
    }
}

impl FailPointDraw {
    /// A draw seeded from the run's seed.
    pub fn new(seed: u64) -> Self {
        Self { rng: StdRng::seed_from_u64(seed ^ 0xF41_1701), drawn: 0, apis_drawn: 0 }
    }

    /// The fail point for the next worker start, if any: always for the first start (so every run
    /// arms one), then for about two starts in three.
    pub fn for_next_start(&mut self) -> Option<Armed> {
        self.drawn += 1;
        if self.rng.random_bool(0.35) && self.drawn > 1 {
            return None;
        }
        let point = WORKER_FAIL_POINTS[self.rng.random_range(0..WORKER_FAIL_POINTS.len())];
        let action = if self.rng.random_bool(0.7) { "return" } else { "panic" };
        Some(Armed { point, action, after: self.rng.random_range(3..40) })
    }

    /// The fail point for the next api start, always for the first (so every run with a broker
    /// arms one), then for about one start in two: the api crashes after committing a message and
    /// before acknowledging it, so its redelivery must be a replay.
    pub fn for_next_api_start(&mut self) -> Option<Armed> {
        self.apis_drawn += 1;
        (self.apis_drawn == 1 || self.rng.random_bool(0.5)).then(|| Armed {
            point: API_FAIL_POINT,
            action: "return",
            after: self.rng.random_range(1..15),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts() -> BTreeMap<Role, usize> {
        [(Role::Api, 2), (Role::Worker, 3), (Role::Reconciler, 2)].into()
    }

    fn intensity() -> Intensity {
        Intensity {
            process_fault_every: Duration::from_secs(3),
            simulator_phase: Duration::from_secs(5),
            lease: Duration::from_secs(4),
            broker_fault_every: None,
        }
    }

    #[test]
    fn a_stopped_broker_is_always_started_again_and_a_short_run_has_both_broker_faults() {
        let with_broker = Intensity { broker_fault_every: Some(Duration::from_secs(10)), ..intensity() };
        for seed in 0..100 {
            let schedule = Schedule::draw(seed, Duration::from_secs(75), with_broker, &counts(), 0);
            let mut stopped = false;
            for scheduled in &schedule.actions {
                match scheduled.action {
                    Action::StopBroker => {
                        assert!(!stopped, "seed {seed}: stopped twice");
                        stopped = true;
                    }
                    Action::StartBroker => {
                        assert!(stopped, "seed {seed}: started a running node");
                        stopped = false;
                    }
                    _ => {}
                }
            }
            assert!(!stopped, "seed {seed}: the node was never started again");
            let kinds: std::collections::BTreeSet<String> =
                schedule.actions.iter().filter_map(|s| s.action.kind()).filter(|k| k.contains("RabbitMQ")).collect();
            assert_eq!(kinds.len(), 2, "seed {seed}: {kinds:?}");
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_schedule_and_another_seed_another() {
        let span = Duration::from_secs(60);
        let a = Schedule::draw(7, span, intensity(), &counts(), 0);
        let b = Schedule::draw(7, span, intensity(), &counts(), 0);
        let c = Schedule::draw(8, span, intensity(), &counts(), 0);

        assert_eq!(a.actions, b.actions);
        assert_ne!(a.actions, c.actions);
    }

    #[test]
    fn every_fault_is_undone_and_targets_and_the_database_are_never_double_booked() {
        for (seed, nodes) in (0..50).flat_map(|seed| [(seed, 0), (seed, 2)]) {
            let schedule = Schedule::draw(seed, Duration::from_secs(120), intensity(), &counts(), nodes);
            let mut down: BTreeMap<(Role, usize), bool> = BTreeMap::new();
            let mut database_down = false;
            for scheduled in &schedule.actions {
                match &scheduled.action {
                    Action::Kill(role, i) | Action::Pause(role, i) => {
                        assert!(!down.insert((*role, *i), true).unwrap_or(false), "seed {seed}: {scheduled:?}");
                        if matches!(scheduled.action, Action::Kill(..)) {
                            assert!(!database_down, "seed {seed}: a kill while PostgreSQL is down");
                        }
                    }
                    Action::Restart(role, i) | Action::Resume(role, i) => {
                        assert!(down.insert((*role, *i), false).unwrap_or(false), "seed {seed}: {scheduled:?}");
                        assert!(!database_down || matches!(scheduled.action, Action::Resume(..)), "seed {seed}");
                    }
                    Action::CrashDatabase | Action::StopDatabaseNode(_) => {
                        assert!(!database_down, "seed {seed}");
                        assert!(matches!(scheduled.action, Action::CrashDatabase) || nodes > 0, "seed {seed}");
                        database_down = true;
                    }
                    Action::ResumeDatabase | Action::StartDatabaseNode(_) => {
                        assert!(database_down, "seed {seed}");
                        database_down = false;
                    }
                    Action::SimulatorFaults(_)
                    | Action::StopBroker
                    | Action::StartBroker
                    | Action::CutBrokerConnections => {}
                }
            }
            assert!(down.values().all(|down| !down), "seed {seed}: a fault was never undone");
            assert!(!database_down, "seed {seed}");
        }
    }

    #[test]
    fn even_a_short_run_injects_every_kind_of_process_fault() {
        for seed in 0..100 {
            let kinds = |nodes| -> std::collections::BTreeSet<String> {
                let schedule = Schedule::draw(seed, Duration::from_secs(75), intensity(), &counts(), nodes);
                schedule.actions.iter().filter_map(|s| s.action.kind()).collect()
            };

            assert_eq!(kinds(0).len(), 6, "seed {seed}: {:?}", kinds(0)); // five process kinds and the simulator
            assert_eq!(kinds(2).len(), 7, "seed {seed}: {:?}", kinds(2)); // and a Citus worker node
        }
    }

    #[test]
    fn the_first_worker_start_always_arms_a_fail_point() {
        for seed in 0..100 {
            assert!(FailPointDraw::new(seed).for_next_start().is_some(), "seed {seed}");
        }
    }

    #[test]
    fn phases_malform_responses_until_the_simulator_has_malformed_one() {
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..200 {
            let phase = simulator_phase(&mut rng);
            let drawn = phase.malformed_rate;

            let before = until_malformed(phase.clone(), false).malformed_rate.unwrap();
            assert!(before >= MALFORMED_AT_LEAST && before >= drawn.unwrap_or(0.0), "{before}");
            assert_eq!(until_malformed(phase, true).malformed_rate, drawn, "once one was, phases keep their draw");
        }
    }

    #[test]
    fn simulator_phases_are_valid_fault_sets() {
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..200 {
            let phase = simulator_phase(&mut rng);
            let defaults = oncepay_simulator::faults::Faults::default();
            defaults.patched(&phase).unwrap();
        }
    }

    #[test]
    fn an_armed_fail_point_fires_once_after_its_quiet_evaluations() {
        let armed = Armed { point: "worker::after_provider", action: "return", after: 12 };

        assert_eq!(armed.env(), "worker::after_provider=12*off->1*return");
    }
}
