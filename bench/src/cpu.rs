//! CPU time, read from `/proc`: what each process of a measured window cost.
//!
//! A [`CpuSampler`] takes a [`CpuSample`] at each edge of a window; their difference is a
//! [`CpuUsage`]: CPU-seconds per [`Role`] plus the whole machine's busy time, so the time no role
//! accounts for (other programs on the machine) shows too. Nothing here starts, stops or signals a
//! process.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::Serialize;

/// Who spent the CPU time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The `oncepay-api` processes.
    Api,
    /// The `oncepay-worker` processes.
    Worker,
    /// The `oncepay-reconciler` processes.
    Reconciler,
    /// The provider simulator.
    Simulator,
    /// Every PostgreSQL process.
    Postgres,
    /// The RabbitMQ node the broker phase starts: its epmd, its server script and every process
    /// under that (the Erlang VM and its helpers).
    Broker,
    /// What generates the load: pgbench, or the load generator's thread.
    Client,
    /// The rest of the benchmark process.
    Bench,
}

impl Role {
    /// The role of a child of the benchmark named `comm` (the kernel keeps 15 characters).
    fn of_child(comm: &str) -> Option<Self> {
        match comm {
            "oncepay-api" => Some(Self::Api),
            "oncepay-worker" => Some(Self::Worker),
            "oncepay-reconci" => Some(Self::Reconciler),
            "oncepay-simulat" => Some(Self::Simulator),
            "pgbench" => Some(Self::Client),
            "rabbitmq-server" | "epmd" => Some(Self::Broker),
            _ => None,
        }
    }
}

/// One line of `/proc/<pid>/stat`, the fields used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    /// The process (or thread) id.
    pub pid: i32,
    /// Its parent.
    pub ppid: i32,
    /// Its command name, at most 15 characters.
    pub comm: String,
    /// `utime + stime`, in clock ticks.
    pub own_ticks: u64,
    /// `cutime + cstime`: its reaped children's time, in clock ticks.
    pub children_ticks: u64,
}

/// Parses `/proc/<pid>/stat`. The command name sits in parentheses and may itself contain spaces
/// and parentheses, so the fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let comm = text.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let field = |i: usize| -> Option<u64> { fields.get(i)?.parse().ok() };
    Some(ProcStat {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        comm,
        own_ticks: field(11)? + field(12)?,
        children_ticks: field(13)? + field(14)?,
    })
}

fn read_stat(path: &str) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(path).ok()?)
}

/// Every process on the machine (those that vanish while being read are skipped).
fn processes() -> Vec<ProcStat> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|entry| read_stat(&format!("{}/stat", entry.path().display())))
        .collect()
}

/// The whole machine's CPU time from the first line of `/proc/stat`, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MachineTicks {
    /// Time spent doing anything (user, nice, system, irq, softirq, steal).
    pub busy: u64,
    /// `busy` plus idle and iowait.
    pub total: u64,
}

/// Parses the `cpu` line of `/proc/stat`.
pub fn parse_machine(text: &str) -> Option<MachineTicks> {
    let line = text.lines().find(|line| line.starts_with("cpu "))?;
    let values: Vec<u64> = line.split_whitespace().skip(1).map(|v| v.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is already inside user and nice).
    let at = |i: usize| values.get(i).copied().unwrap_or(0);
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    Some(MachineTicks { busy, total: busy + at(3) + at(4) })
}

/// The kernel's clock ticks per second, the unit of `/proc` CPU times.
pub fn ticks_per_second() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(ticks)) if ticks > 0 => ticks as f64,
        // USER_HZ is 100 on every Linux architecture that matters; sysconf cannot really fail here.
        _ => 100.0,
    }
}

/// What produces the load being measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientSource {
    /// A child process (pgbench), found among the children by name.
    Process,
    /// A thread of this process (the load generator).
    Thread(i32),
    /// This whole process: the broker phase's producer and consumer, whose connections lapin
    /// drives from threads of its own.
    ThisProcess,
}

/// Takes samples for one window's accounting.
#[derive(Debug, Clone)]
pub struct CpuSampler {
    postmasters: Vec<i32>,
    client: ClientSource,
}

/// CPU times at one instant.
#[derive(Debug, Clone)]
pub struct CpuSample {
    at: Instant,
    ticks: BTreeMap<Role, u64>,
    machine: MachineTicks,
}

/// CPU spent between two samples.
#[derive(Debug, Clone, Serialize)]
pub struct CpuUsage {
    /// Wall-clock seconds between the samples.
    pub wall_seconds: f64,
    /// CPU-seconds spent by each role.
    pub seconds: BTreeMap<Role, f64>,
    /// How many cores the whole machine kept busy on average (2.0 = both of 2 cores).
    pub machine_busy_cores: f64,
    /// Busy cores that no role accounts for: other programs running on the machine meanwhile.
    pub other_cores: f64,
}

impl CpuUsage {
    /// CPU-seconds of `role` (0 when it did not run).
    pub fn of(&self, role: Role) -> f64 {
        self.seconds.get(&role).copied().unwrap_or(0.0)
    }

    /// Average cores `role` kept busy.
    pub fn cores(&self, role: Role) -> f64 {
        if self.wall_seconds > 0.0 { self.of(role) / self.wall_seconds } else { 0.0 }
    }
}

impl CpuSampler {
    /// Accounts PostgreSQL under `postmasters` (one per node of a Citus cluster) and the load to
    /// `client`.
    pub fn new(postmasters: &[i32], client: ClientSource) -> Self {
        Self { postmasters: postmasters.to_vec(), client }
    }

    /// The CPU times now.
    ///
    /// PostgreSQL is each postmaster's own time and that of the children it has reaped (`cutime`,
    /// `cstime`: backends that exited), plus every live child's own time (backends, checkpointer,
    /// WAL writer, autovacuum), so nothing is lost when a backend exits mid-window. The binaries,
    /// and pgbench as the client, are this process's children, told apart by command name; each
    /// counts all its threads. The RabbitMQ node is the tree under its server script and its epmd,
    /// both this process's children. The load generator is one thread of this process; `bench` is
    /// the rest of it (orchestration, copying the children's logs).
    pub fn sample(&self) -> CpuSample {
        let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        let with_pgbench = self.client == ClientSource::Process;
        let mut ticks = ticks_by_role(&processes(), me, &self.postmasters, with_pgbench);
        let mut add = |role: Role, value: u64| *ticks.entry(role).or_default() += value;
        let own = read_stat("/proc/self/stat").map_or(0, |stat| stat.own_ticks);
        match self.client {
            ClientSource::Thread(tid) => {
                let thread = read_stat(&format!("/proc/self/task/{tid}/stat")).map_or(0, |stat| stat.own_ticks);
                add(Role::Client, thread);
                add(Role::Bench, own.saturating_sub(thread));
            }
            ClientSource::Process => add(Role::Bench, own),
            ClientSource::ThisProcess => add(Role::Client, own),
        }
        let machine =
            std::fs::read_to_string("/proc/stat").ok().and_then(|text| parse_machine(&text)).unwrap_or_default();
        CpuSample { at: Instant::now(), ticks, machine }
    }
}

/// The clock ticks of `processes` by role, for a benchmark process `me`: PostgreSQL under
/// `postmasters`, the children of `me` by name (pgbench only `with_pgbench`), and the RabbitMQ
/// node's whole tree.
///
/// A process of the node's tree counts with its reaped children (`cutime`, `cstime`): a helper that
/// exits moves its time into its parent's, so the tree's total never drops.
fn ticks_by_role(processes: &[ProcStat], me: i32, postmasters: &[i32], with_pgbench: bool) -> BTreeMap<Role, u64> {
    let parents: HashMap<i32, i32> = processes.iter().map(|process| (process.pid, process.ppid)).collect();
    // The node's server script is this process's child; the Erlang VM runs under it, not under us.
    let broker_roots: Vec<i32> = processes
        .iter()
        .filter(|process| process.ppid == me && Role::of_child(&process.comm) == Some(Role::Broker))
        .map(|process| process.pid)
        .collect();
    let in_broker_tree = |pid: i32| {
        let mut at = pid;
        // The chain is short (server script, VM, helper); the bound only guards against a cycle
        // read while pids are reused.
        for _ in 0..16 {
            if broker_roots.contains(&at) {
                return true;
            }
            match parents.get(&at) {
                Some(&parent) if parent > 1 && parent != me => at = parent,
                _ => return false,
            }
        }
        false
    };
    let mut ticks: BTreeMap<Role, u64> = BTreeMap::new();
    let mut add = |role: Role, value: u64| *ticks.entry(role).or_default() += value;
    for process in processes {
        if postmasters.contains(&process.pid) {
            add(Role::Postgres, process.own_ticks + process.children_ticks);
        } else if postmasters.contains(&process.ppid) {
            add(Role::Postgres, process.own_ticks);
        } else if in_broker_tree(process.pid) {
            add(Role::Broker, process.own_ticks + process.children_ticks);
        } else if process.ppid == me
            && let Some(role) = Role::of_child(&process.comm)
            && (role != Role::Client || with_pgbench)
        {
            add(role, process.own_ticks);
        }
    }
    ticks
}

impl CpuSample {
    /// The CPU spent from `earlier` to this sample.
    pub fn since(&self, earlier: &CpuSample) -> CpuUsage {
        let hz = ticks_per_second();
        let wall_seconds = self.at.duration_since(earlier.at).as_secs_f64();
        let seconds: BTreeMap<Role, f64> = self
            .ticks
            .iter()
            .map(|(role, &now)| {
                let before = earlier.ticks.get(role).copied().unwrap_or(0);
                (*role, now.saturating_sub(before) as f64 / hz)
            })
            .collect();
        let busy = self.machine.busy.saturating_sub(earlier.machine.busy) as f64 / hz;
        let machine_busy_cores = if wall_seconds > 0.0 { busy / wall_seconds } else { 0.0 };
        let attributed: f64 = seconds.values().sum();
        let other_cores = if wall_seconds > 0.0 { ((busy - attributed) / wall_seconds).max(0.0) } else { 0.0 };
        CpuUsage { wall_seconds, seconds, machine_busy_cores, other_cores }
    }
}

/// The number of this thread, for [`ClientSource::Thread`].
pub fn current_thread_id() -> i32 {
    nix::unistd::gettid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_is_read_from_the_last_parenthesis() {
        let line = "4242 (postgres: x) (y) S 4200 4200 4200 0 -1 4194560 100 0 0 0 250 50 7 3 20 0 1 0 9 \
                    100000 200 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";

        let stat = parse_stat(line).unwrap();

        assert_eq!(
            stat,
            ProcStat { pid: 4242, ppid: 4200, comm: "postgres: x) (y".into(), own_ticks: 300, children_ticks: 10 }
        );
    }

    #[test]
    fn a_truncated_stat_line_is_refused() {
        assert_eq!(parse_stat("12 (sh) S 1 12 12"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn the_machine_line_counts_busy_time_without_idle_and_iowait() {
        let text = "cpu  100 5 40 1000 20 3 2 1 0 0\ncpu0 50 2 20 500 10 1 1 0 0 0\n";

        assert_eq!(parse_machine(text), Some(MachineTicks { busy: 151, total: 1171 }));
    }

    #[test]
    fn children_are_told_apart_by_their_truncated_command_names() {
        assert_eq!(Role::of_child("oncepay-api"), Some(Role::Api));
        assert_eq!(Role::of_child("oncepay-worker"), Some(Role::Worker));
        assert_eq!(Role::of_child("oncepay-reconci"), Some(Role::Reconciler));
        assert_eq!(Role::of_child("oncepay-simulat"), Some(Role::Simulator));
        assert_eq!(Role::of_child("pgbench"), Some(Role::Client));
        assert_eq!(Role::of_child("rabbitmq-server"), Some(Role::Broker));
        assert_eq!(Role::of_child("psql"), None);
    }

    fn stat(pid: i32, ppid: i32, comm: &str, own_ticks: u64, children_ticks: u64) -> ProcStat {
        ProcStat { pid, ppid, comm: comm.into(), own_ticks, children_ticks }
    }

    #[test]
    fn the_rabbitmq_node_counts_with_everything_under_its_server_script_and_nothing_else_does() {
        let me = 100;
        let processes = [
            stat(me, 1, "oncepay-bench", 1, 0),
            stat(200, 1, "postgres", 10, 5),
            stat(201, 200, "postgres", 20, 0),
            stat(300, me, "oncepay-api", 30, 0),
            stat(400, me, "epmd", 1, 0),
            stat(401, me, "rabbitmq-server", 2, 3),
            stat(402, 401, "beam.smp", 40, 4),
            stat(403, 402, "erl_child_setup", 1, 0),
            // Another node on the machine, not started by this process.
            stat(500, 1, "rabbitmq-server", 7, 0),
            stat(501, 500, "beam.smp", 70, 0),
            stat(600, me, "pgbench", 9, 0),
        ];

        let ticks = ticks_by_role(&processes, me, &[200], false);

        assert_eq!(
            ticks,
            BTreeMap::from([(Role::Api, 30), (Role::Postgres, 35), (Role::Broker, 1 + 2 + 3 + 40 + 4 + 1)])
        );
        assert_eq!(ticks_by_role(&processes, me, &[200], true).get(&Role::Client), Some(&9));
    }

    #[test]
    fn usage_is_the_difference_of_two_samples() {
        let hz = ticks_per_second();
        let start = Instant::now();
        let earlier = CpuSample {
            at: start,
            ticks: BTreeMap::from([(Role::Api, 100), (Role::Postgres, 1000)]),
            machine: MachineTicks { busy: 5000, total: 9000 },
        };
        let later = CpuSample {
            at: start + std::time::Duration::from_secs(2),
            ticks: BTreeMap::from([(Role::Api, 100 + hz as u64), (Role::Postgres, 1000 + 2 * hz as u64)]),
            machine: MachineTicks { busy: 5000 + 4 * hz as u64, total: 9000 + 4 * hz as u64 },
        };

        let usage = later.since(&earlier);

        assert_eq!(usage.of(Role::Api), 1.0);
        assert_eq!(usage.cores(Role::Postgres), 1.0);
        assert_eq!(usage.of(Role::Worker), 0.0);
        assert_eq!(usage.machine_busy_cores, 2.0);
        assert_eq!(usage.other_cores, 0.5);
    }
}
