//! The chaos run: the system under a seeded workload and a seeded fault schedule, then healed,
//! settled and checked. [`run`] is what the `oncepay-chaos` binary and the short-profile test call.
//!
//! Everything random comes from the one seed, so `--seed N` replays the same plan, schedule and
//! fail-point draws (the exact interleaving of processes is the operating system's). The worker
//! and api binaries must carry fail points ([`Crashable::build`] builds them); the normal binaries
//! never do.
//!
//! Part of the workload is published to RabbitMQ, on a node of the run's own, as a real producer
//! publishes (confirms, the same message again without one); the broker's faults are the node
//! stopped and started, every connection cut, and an api crashed between a message's commit and its
//! acknowledgement.
//!
//! Each tenant subscribes endpoints at a receiver inside the harness that misbehaves by a seeded
//! plan (`receiver.rs`), so the worker's deliveries meet timeouts, errors, dropped connections and
//! an endpoint that goes away while its processes are killed and paused; invariant 11 is judged on
//! what the receiver got (`events.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use oncepay_devkit::pg::Durability;
use oncepay_devkit::process::setting_variable;
use tokio::time::Instant;

use crate::broker::BrokerVerdict;
use crate::checker::{self, Settled, Verdict};
use crate::events::{self, EventsVerdict};
use crate::faults::{self, Action, FailPointDraw, Intensity, Schedule, calm};
use crate::operations::{Failure, OperatorClient, Retried};
use crate::receiver::Receiver;
use crate::report::Report;
use crate::system::{Binaries, Processes, Provider, Role, System, SystemConfig, Timing, Topology};
use crate::workload::{self, Clients, Plan, WorkloadConfig};

/// How big and how long a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// A few minutes; runs in CI.
    Short,
    /// Tens of minutes; on demand.
    Long,
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// The one seed.
    pub seed: u64,
    /// The profile it was built from.
    pub profile: Profile,
    /// How long faults are injected (and intents started).
    pub span: Duration,
    /// Intents in all.
    pub intents: usize,
    /// Intents in progress at once.
    pub concurrency: usize,
    /// Tenants.
    pub tenants: usize,
    /// Processes.
    pub topology: Topology,
    /// Mean time between process faults.
    pub process_fault_every: Duration,
    /// How long the system may take to settle after healing.
    pub settle_bound: Duration,
    /// Fraction of intents published to RabbitMQ instead of sent over HTTP; 0 runs no broker.
    pub broker_rate: f64,
    /// Mean time between two broker faults.
    pub broker_fault_every: Duration,
    /// Keep the logs even when the run passes.
    pub keep_logs: bool,
}

impl ChaosConfig {
    /// The settings of `profile` for `seed`.
    pub fn new(profile: Profile, seed: u64) -> Self {
        match profile {
            Profile::Short => Self {
                seed,
                profile,
                span: Duration::from_secs(75),
                intents: 600,
                concurrency: 24,
                tenants: 2,
                topology: Topology { apis: 2, workers: 3, reconcilers: 2 },
                process_fault_every: Duration::from_secs(4),
                settle_bound: Duration::from_secs(120),
                broker_rate: 0.2,
                broker_fault_every: Duration::from_secs(12),
                keep_logs: false,
            },
            Profile::Long => Self {
                seed,
                profile,
                span: Duration::from_secs(20 * 60),
                intents: 12_000,
                concurrency: 48,
                tenants: 3,
                topology: Topology { apis: 2, workers: 4, reconcilers: 2 },
                process_fault_every: Duration::from_secs(5),
                settle_bound: Duration::from_secs(300),
                broker_rate: 0.2,
                broker_fault_every: Duration::from_secs(20),
                keep_logs: false,
            },
        }
    }
}

/// What a run found: its report, and where the logs are if they were kept.
#[derive(Debug)]
pub struct Finished {
    /// What to print.
    pub report: Report,
    /// The logs of every process, kept when the run failed (or when asked).
    pub logs: Option<PathBuf>,
}

impl Finished {
    /// Whether every invariant held and everything settled.
    pub fn passed(&self) -> bool {
        self.report.passed()
    }
}

/// The binaries that carry fail points: the worker, and the api (its broker consumer's).
#[derive(Debug, Clone)]
pub struct Crashable {
    /// `oncepay-worker` built with `--features failpoints`.
    pub worker: PathBuf,
    /// `oncepay-api` built with `--features failpoints`.
    pub api: PathBuf,
}

impl Crashable {
    /// The two binaries in `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        Self { worker: dir.join("oncepay-worker"), api: dir.join("oncepay-api") }
    }

    /// Builds them into `<target>/chaos`. The normal binaries stay free of fail points: cargo
    /// features are unified per target directory, so building this feature into `target/debug`
    /// would replace the normal worker and api.
    pub async fn build() -> anyhow::Result<Self> {
        let root = workspace_root();
        let chaos_target = target_dir()?.join("chaos");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let output = tokio::process::Command::new(cargo)
            .args(["build", "--quiet", "--locked", "-p", "oncepay-worker", "-p", "oncepay-api"])
            .args(["--features", "oncepay-worker/failpoints,oncepay-api/failpoints", "--target-dir"])
            .arg(&chaos_target)
            .current_dir(&root)
            .output()
            .await
            .context("cannot run cargo to build the binaries with fail points")?;
        if !output.status.success() {
            bail!("building the binaries with fail points failed:\n{}", String::from_utf8_lossy(&output.stderr));
        }
        let built = Self::in_dir(&chaos_target.join("debug"));
        for binary in [&built.worker, &built.api] {
            if !binary.is_file() {
                bail!("cargo built no {}", binary.display());
            }
        }
        Ok(built)
    }
}

fn workspace_root() -> PathBuf {
    // tests/ is one level below the root.
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The target directory the running executable was built into (`<target>/<profile>/[deps/]exe`).
fn target_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().context("the running executable has no directory")?.to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir.pop();
    Ok(dir)
}

/// Runs the chaos harness once with the `crashable` worker and api.
pub async fn run(config: &ChaosConfig, crashable: Crashable) -> anyhow::Result<Finished> {
    let seed = config.seed;
    let mut binaries = Binaries::built()?;
    binaries.worker = crashable.worker;
    binaries.api = crashable.api;
    let timing = Timing::default();
    let tenants = (0..config.tenants).map(|i| format!("tenant-{i}")).collect();
    let mut system = System::start(SystemConfig {
        binaries,
        topology: config.topology,
        tenants,
        // The run crashes PostgreSQL.
        durability: Durability::Durable,
        timing,
        provider: Provider::Simulator { seed },
        log_dir: None,
        // Every resend the harness's operator asks for waits for a second operator to approve it; and
        // the events' settings for the run's receiver.
        env: [(
            Processes::Only(Role::Reconciler),
            setting_variable("operators.retries_need_approval"),
            "true".to_owned(),
        )]
        .into_iter()
        .chain(events::settings())
        .collect(),
        broker: config.broker_rate > 0.0,
    })
    .await?;
    let result = drive(config, &mut system, timing).await;
    let unclean = system.shutdown().await.unwrap_or_else(|error| vec![format!("{error:#}")]);
    let mut report = match result {
        Ok(report) => report,
        Err(error) => {
            let logs = system.keep_logs();
            return Err(error.context(format!("seed {}; every process's log is in {}", config.seed, logs.display())));
        }
    };
    for line in unclean {
        report.verdict.notes.push(format!("on SIGTERM: {line}"));
    }
    let logs = (config.keep_logs || !report.passed()).then(|| system.keep_logs());
    Ok(Finished { report, logs })
}

/// Arms fail points on the workers and sends the workload from its own task while the fault loop
/// injects the scheduled faults; then heals everything, lets the workload finish, sends every
/// intent that got no response again, settles within a bound and checks every invariant.
async fn drive(config: &ChaosConfig, system: &mut System, timing: Timing) -> anyhow::Result<Report> {
    let seed = config.seed;
    let counts: BTreeMap<Role, usize> =
        [Role::Api, Role::Worker, Role::Reconciler].into_iter().map(|role| (role, system.count(role))).collect();
    let schedule = Schedule::draw(
        seed,
        config.span,
        Intensity {
            process_fault_every: config.process_fault_every,
            simulator_phase: Duration::from_secs(6),
            lease: Duration::from_secs(timing.lease_secs),
            broker_fault_every: system.broker().map(|_| config.broker_fault_every),
        },
        &counts,
        system.database_nodes(),
    );
    let operators = Operators::make(system).await.context("cannot make the harness's operators")?;
    // Before any fail point is armed and any payment made: an endpoint sees every event of its tenant.
    let receiver = Receiver::start(seed, events::TOO_LATE).await?;
    let subscriptions = events::subscribe(system, &receiver).await.context("cannot subscribe the receiver")?;
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    let mut fail_points = FailPointDraw::new(seed);
    for role in [Role::Worker, Role::Api] {
        for index in 0..system.count(role) {
            restart(system, role, index, &mut fail_points, &mut faults).await?;
        }
    }

    let workload_config = WorkloadConfig {
        seed,
        intents: config.intents,
        concurrency: config.concurrency,
        spread: config.span,
        storm_rate: 0.08,
        storm_size: 6,
        shared_key_rate: 0.05,
        misuse_rate: 0.05,
        probe_rate: 0.05,
        follow: Duration::from_secs(20),
        resends: 4,
        payment_methods: Vec::new(),
        refund_rate: 0.2,
        broker_rate: config.broker_rate,
    };
    let plan = Arc::new(Plan::draw(&workload_config, config.tenants, system.count(Role::Api))?);
    let clients = Clients::new(system.tenants(), &system.api_urls())?;
    let workload = tokio::spawn({
        let (plan, clients, workload_config) = (plan.clone(), clients.clone(), workload_config.clone());
        async move { workload::run(&plan, &workload_config, &clients).await }
    });

    // The fault loop: every scheduled action at its time, every process a fail point crashed
    // started again (with a new draw) as soon as PostgreSQL is up, and an operator's round of
    // dead-letter retries every `OPERATOR_ROUND`.
    let begin = Instant::now();
    let mut next = 0;
    let mut crashed: Vec<(Role, usize)> = Vec::new();
    let mut operator_round = begin;
    while next < schedule.actions.len() || !crashed.is_empty() {
        let due = schedule.actions.get(next).map(|s| begin + s.at);
        let tick = Instant::now() + Duration::from_millis(250);
        tokio::time::sleep_until(due.map_or(tick, |due| due.min(tick))).await;
        for exited in system.exited() {
            let code = exited.status.code();
            *faults.entry(format!("{} exited by itself (code {code:?})", exited.role.as_str())).or_default() += 1;
            crashed.push((exited.role, exited.index));
        }
        if system.database_up() {
            for (role, index) in std::mem::take(&mut crashed) {
                restart(system, role, index, &mut fail_points, &mut faults).await?;
            }
        }
        while let Some(scheduled) = schedule.actions.get(next).filter(|s| begin + s.at <= Instant::now()) {
            next += 1;
            if let Some(kind) = scheduled.action.kind() {
                *faults.entry(kind).or_default() += 1;
            }
            apply(system, &scheduled.action, &mut fail_points, &mut faults, &mut crashed).await?;
        }
        if Instant::now() >= operator_round {
            operator_round = Instant::now() + OPERATOR_ROUND;
            retry_dead_letters(system, &operators, &mut faults).await?;
        }
    }

    // Heal: no provider fault, every process back without fail points.
    let phase = |what: &str| eprintln!("oncepay-chaos: {:>6.1} s: {what}", begin.elapsed().as_secs_f64());
    phase("the faults are over; healing");
    system.simulator()?.set_faults(&calm()).await?;
    system.heal().await?;
    phase("healed; waiting for the workload to finish");
    let mut observations = workload.await.context("the workload task failed")?;
    phase("the workload finished; sending unanswered intents again");
    workload::resend_unanswered(&plan, &clients, &mut observations).await;
    phase("waiting for the payments to settle");
    let settled: Settled = checker::settle(system.pool(), config.settle_bound).await?;
    phase("the payments settled; waiting for the broker's messages");
    let mut broker = match system.broker() {
        Some(broker) => {
            let in_flight = broker.settle(config.settle_bound).await?;
            let dead_letters = broker.dead_letters().await?;
            Some(BrokerVerdict::judge(system.pool(), system.tenants(), &observations, in_flight, &dead_letters).await?)
        }
        None => None,
    };
    phase("checking against the provider's ground truth");
    let truth = system.simulator()?.ground_truth().await?;
    let refunds = system.simulator()?.refund_truth().await?;
    let mut verdict: Verdict =
        checker::check(system.pool(), &truth.charges, &refunds.refunds, system.tenants(), &observations).await?;
    if let Some(broker) = &mut broker {
        verdict.violations.append(&mut broker.violations);
    }
    // After the payments settled: their last events are written by then.
    phase("waiting for the events' deliveries to settle");
    events::settle(system.pool(), config.settle_bound).await?;
    phase("judging the events");
    let mut events = EventsVerdict::judge(system.pool(), &subscriptions, &receiver).await?;
    verdict.violations.append(&mut events.violations);
    verdict.violations.sort();
    for (fault, count) in simulator_fault_counts(system.simulator_url()?).await? {
        faults.insert(format!("simulator: {fault}"), count);
    }
    Ok(Report {
        title: format!("oncepay-chaos, profile {:?}", config.profile).to_lowercase(),
        seed,
        span: config.span,
        topology: config.topology,
        tenants: config.tenants,
        faults,
        plan_storms: plan.jobs.iter().filter(|j| j.copies > 1).count(),
        observations,
        settled,
        verdict,
        two_phase_commits: system.two_phase_commits_since_start().await?,
        broker,
        events: Some(events),
    })
}

/// How often the harness's operator looks at the dead-letter table.
const OPERATOR_ROUND: Duration = Duration::from_secs(2);

/// The harness's operators, made through the operations API when the run starts:
/// `chaos` retries dead letters, and `chaos-approver` approves the resends, which the run's
/// reconcilers all propose rather than do (`operators.retries_need_approval`).
struct Operators {
    operator: OperatorClient,
    approver: OperatorClient,
}

impl Operators {
    /// The system's admin makes the two over HTTP.
    async fn make(system: &System) -> anyhow::Result<Self> {
        let admin = OperatorClient::admin(system)?;
        let reason = "chaos: the harness's operators";
        Ok(Self {
            operator: admin.create_operator("chaos", "operator", reason).await?,
            approver: admin.create_operator("chaos-approver", "approver", reason).await?,
        })
    }

    /// The approver approves proposal `proposal_id`, or rejects it if the approval is refused.
    async fn decide(&self, proposal_id: uuid::Uuid) -> Decided {
        match self.approver.approve(proposal_id, "chaos: the provider is back").await {
            Ok(()) => Decided::Approved,
            Err(Failure::Refused(_)) => {
                // Rejected so that the operator can propose the payment again (one proposal waits per
                // payment); if this fails too, the next round finds the proposal waiting.
                let _ = self.approver.reject(proposal_id, "chaos: the approval was refused").await;
                Decided::Refused
            }
            Err(Failure::Failed(_)) => Decided::Failed,
        }
    }
}

/// How an approver's decision on a proposal went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decided {
    /// Approved: the payment was sent again.
    Approved,
    /// The approval was refused (the payment moved, or is past the key window), and the proposal
    /// rejected.
    Refused,
    /// No reconciler responded, or one failed (its database down): the proposal may still wait.
    Failed,
}

impl Decided {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Approved => "approved",
            Self::Refused => "approval refused",
            Self::Failed => "approval failed",
        }
    }
}

/// What an operator following the runbook does while the provider misbehaves: retries every open
/// `unresolved` dead letter through the operations API, and a second operator approves each resend.
/// The reconciler refuses a resend past the key window, and an approval if the payment moved since
/// the proposal; either way the payment must still end explained, and charged at most once. A
/// reconciler killed, paused or without its database fails the round, which is counted, not fatal.
async fn retry_dead_letters(
    system: &System,
    operators: &Operators,
    faults: &mut BTreeMap<String, u64>,
) -> anyhow::Result<()> {
    if !system.database_up() {
        return Ok(());
    }
    // Proposals a failed round left waiting (the approval was lost with its reconciler).
    let Ok(waiting) = operators.approver.pending_proposals().await else {
        *faults.entry("operator round abandoned: cannot list the waiting proposals".to_owned()).or_default() += 1;
        return Ok(());
    };
    for proposal_id in waiting {
        let decided = operators.decide(proposal_id).await;
        *faults.entry(format!("operator decision on a waiting proposal: {}", decided.as_str())).or_default() += 1;
        if decided == Decided::Failed {
            return Ok(());
        }
    }
    let open = match sqlx::query_scalar!(
        "SELECT payment_id FROM dead_letters WHERE kind = 'unresolved' AND resolved_at IS NULL LIMIT 10"
    )
    .fetch_all(system.pool())
    .await
    {
        Ok(open) => open,
        Err(_) => return Ok(()),
    };
    for payment_id in open {
        let (done, go_on) = match operators.operator.retry(payment_id, "chaos: the provider is back").await {
            Ok(Retried::Proposed(proposal_id)) => match operators.decide(proposal_id).await {
                Decided::Approved => ("proposed and approved", true),
                Decided::Refused => ("proposed, approval refused", true),
                Decided::Failed => ("proposed, approval failed", false),
            },
            // The run's reconcilers propose every resend: one done at once skipped the second operator.
            Ok(Retried::Resent) => bail!("payment {payment_id} was resent without a second operator's approval"),
            Err(Failure::Refused(_)) => ("refused", true),
            // No reconciler responded, or one failed: the rest of the round would fare no better, after
            // as long a wait for each.
            Err(Failure::Failed(_)) => ("failed", false),
        };
        *faults.entry(format!("operator retry of a dead letter: {done}")).or_default() += 1;
        if !go_on {
            break;
        }
    }
    Ok(())
}

/// Starts process `index` of `role` again, a worker or (with a broker) an api with the next
/// fail-point draw.
async fn restart(
    system: &mut System,
    role: Role,
    index: usize,
    fail_points: &mut FailPointDraw,
    faults: &mut BTreeMap<String, u64>,
) -> anyhow::Result<()> {
    let armed = match role {
        Role::Worker => fail_points.for_next_start(),
        Role::Api if system.broker().is_some() => fail_points.for_next_api_start(),
        Role::Api | Role::Reconciler => None,
    };
    let env = match armed {
        Some(armed) => {
            *faults.entry(format!("{} armed", armed.kind())).or_default() += 1;
            vec![("FAILPOINTS".to_owned(), armed.env())]
        }
        None => Vec::new(),
    };
    system.restart(role, index, &env).await
}

async fn apply(
    system: &mut System,
    action: &Action,
    fail_points: &mut FailPointDraw,
    faults: &mut BTreeMap<String, u64>,
    crashed: &mut Vec<(Role, usize)>,
) -> anyhow::Result<()> {
    match action {
        Action::Kill(role, index) => system.kill(*role, *index).await?,
        Action::Restart(role, index) => {
            crashed.retain(|c| c != &(*role, *index));
            if system.database_up() {
                restart(system, *role, *index, fail_points, faults).await?;
            } else {
                crashed.push((*role, *index));
            }
        }
        Action::Pause(role, index) => {
            if system.is_running(*role, *index) {
                system.pause(*role, *index)?;
            }
        }
        Action::Resume(role, index) => system.resume(*role, *index)?,
        Action::CrashDatabase => system.crash_database().await?,
        Action::ResumeDatabase => system.resume_database().await?,
        Action::StopDatabaseNode(index) => system.crash_database_node(*index).await?,
        Action::StartDatabaseNode(index) => system.resume_database_node(*index).await?,
        Action::SimulatorFaults(patch) => {
            let malformed_yet = simulator_fault_counts(system.simulator_url()?)
                .await?
                .iter()
                .any(|(fault, count)| fault == "malformed" && *count > 0);
            let patch = faults::until_malformed((**patch).clone(), malformed_yet);
            system.simulator()?.set_faults(&patch).await?;
        }
        Action::StopBroker => system.broker_mut()?.stop().await?,
        Action::StartBroker => system.broker_mut()?.start_again().await?,
        Action::CutBrokerConnections => system.broker_mut()?.cut_connections().await?,
    }
    Ok(())
}

/// `oncepay_simulator_faults_total` and the webhook fates from the simulator's `/metrics`.
async fn simulator_fault_counts(simulator_url: &str) -> anyhow::Result<Vec<(String, u64)>> {
    let text = reqwest::get(format!("{simulator_url}/metrics")).await?.error_for_status()?.text().await?;
    let mut counts = Vec::new();
    for line in text.lines() {
        for (metric, label) in
            [("oncepay_simulator_faults_total{", "fault=\""), ("oncepay_simulator_webhook_events_total{", "fate=\"")]
        {
            if let Some(rest) = line.strip_prefix(metric)
                && let Some((labels, value)) = rest.split_once("} ")
                && let Some(name) = labels.split(label).nth(1).and_then(|v| v.split('"').next())
                && let Ok(value) = value.trim().parse::<f64>()
            {
                let name = if label.starts_with("fate") { format!("webhook {name}") } else { name.to_owned() };
                if name != "webhook queued" && name != "none" {
                    counts.push((name, value as u64));
                }
            }
        }
    }
    Ok(counts)
}
