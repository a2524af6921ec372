//! `cargo xtask mutants`: mutation checks on the money guards (docs/mutation-testing.md).
//!
//! Each guard is the few functions that hold one promise, in one file, and the tests that must see
//! it break. cargo-mutants (pinned: [`CARGO_MUTANTS`]) changes each function in the ways it knows
//! (a body replaced by a constant, an operator swapped, a `!` dropped), builds, and runs the guard's
//! tests against a throwaway PostgreSQL; a mutant that no test fails survives. The task fails on a
//! survivor unless [`EQUIVALENT`] lists it with the reason no test can tell it from the original.
//!
//! The mutants are made in the working tree (cargo-mutants' `--in-place`), so that each build is
//! incremental over the usual target directory rather than a fresh copy of the workspace; the task
//! refuses to start while a guard's file has uncommitted changes, and cargo-mutants puts every file
//! back when it stops, also on Ctrl-C.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail, ensure};
use tokio::process::Command;

/// The cargo-mutants release the checks are written for (`cargo install cargo-mutants --locked
/// --version …` when it is missing).
pub const CARGO_MUTANTS: &str = "27.1.0";

/// One money guard.
struct Guard {
    /// Its name on the command line and in the report.
    name: &'static str,
    /// The file that holds it.
    file: &'static str,
    /// Which of the file's functions to mutate, a regular expression over cargo-mutants' names of
    /// its mutants (which name the function).
    functions: &'static str,
    /// The packages whose tests run.
    packages: &'static [&'static str],
    /// Which of them, as a nextest filter expression.
    tests: &'static str,
    /// The one mutant CI tries on every change, if any: the guard simply gone.
    ci: Option<&'static str>,
}

/// Every guard, in the order they run.
const GUARDS: [Guard; 6] = [
    Guard {
        name: "payment-resend",
        file: "shared/store/src/sending.rs",
        functions: r"Claimed::send_is_safe",
        packages: &["oncepay-worker"],
        tests: "test(/^fencing::|^requeued::/)",
        ci: Some(r"replace Claimed::send_is_safe -> bool with true"),
    },
    Guard {
        name: "refund-resend",
        file: "shared/store/src/refunds/sending.rs",
        functions: r"ClaimedRefund::send_is_safe",
        packages: &["oncepay-worker"],
        tests: "test(/^refunds::/)",
        ci: Some(r"replace ClaimedRefund::send_is_safe -> bool with true"),
    },
    Guard {
        name: "settlement",
        file: "shared/store/src/settlement.rs",
        functions: r"\b(same_account|settlement_of|same_terms)\b",
        packages: &["oncepay-store"],
        tests: "kind(lib)",
        ci: None,
    },
    Guard {
        name: "fingerprint",
        file: "shared/domain/src/fingerprint.rs",
        functions: r"Fingerprint::of|\bgiven\b",
        packages: &["oncepay-domain"],
        tests: "all()",
        ci: None,
    },
    Guard {
        name: "four-eyes",
        file: "shared/ops/src/operators/proposals.rs",
        functions: r"shares_a_holder_with|may_be_proposed_by|\bapprove\b",
        packages: &["oncepay-ops", "oncepay-reconciler"],
        tests: "package(oncepay-ops) | test(/^operators::.*(approv|propos)|^refund_proposals::/)",
        ci: None,
    },
    Guard {
        name: "refund-reservation",
        file: "shared/store/src/refunds/intake.rs",
        functions: r"\breserve\b",
        packages: &["oncepay-api"],
        tests: "test(/^refunds::/)",
        ci: None,
    },
];

/// Survivors no test can catch, because the mutant behaves as the original does: the mutant as
/// cargo-mutants names it (without its line), and why.
const EQUIVALENT: [(&str, &str); 1] = [(
    "replace match guard fields.values().any(Value::is_null) with true in given",
    "the guard only spares a copy of a body with no null member; copied without its null members, \
     such a body is the same body, so its fingerprint is the same",
)];

/// How one guard's run ended.
struct Outcome {
    name: &'static str,
    caught: usize,
    missed: Vec<String>,
    timed_out: Vec<String>,
    unviable: usize,
    seconds: u64,
}

/// Runs the guards named in `only` (every one when empty; with `ci`, the one mutant of each guard
/// that names one for CI), prints a table, and fails on any survivor [`EQUIVALENT`] does not
/// explain.
pub async fn mutants(root: &Path, ci: bool, only: &[String]) -> anyhow::Result<ExitCode> {
    for name in only {
        ensure!(GUARDS.iter().any(|guard| guard.name == name), "no guard is called {name}");
    }
    let wanted = |guard: &&Guard| match (ci, only.is_empty()) {
        (true, _) => guard.ci.is_some(),
        (false, true) => true,
        (false, false) => only.iter().any(|name| name == guard.name),
    };
    let chosen: Vec<&Guard> = GUARDS.iter().filter(wanted).collect();
    install().await?;
    unchanged(root, &chosen).await?;
    let (url, _cluster) = crate::database_server().await?;
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for guard in chosen {
        outcomes.push(run(root, guard, &url, ci).await?);
    }
    report(&outcomes, started.elapsed().as_secs());
    let mut unexplained = Vec::new();
    for mutant in outcomes.iter().flat_map(|outcome| outcome.missed.iter().chain(&outcome.timed_out)) {
        match EQUIVALENT.iter().find(|(equivalent, _)| mutant.ends_with(equivalent)) {
            Some((_, why)) => eprintln!("xtask: survived, equivalent: {mutant}: {why}"),
            None => unexplained.push(mutant),
        }
    }
    if unexplained.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("xtask: {} mutants survived that no test caught and none is known to be equivalent:", unexplained.len());
    for mutant in unexplained {
        eprintln!("  {mutant}");
    }
    Ok(ExitCode::FAILURE)
}

/// Installs the pinned cargo-mutants unless it is there.
async fn install() -> anyhow::Result<()> {
    let version = Command::new("cargo").args(["mutants", "--version"]).output().await;
    let wanted = format!("cargo-mutants {CARGO_MUTANTS}");
    if let Ok(output) = version
        && String::from_utf8_lossy(&output.stdout).trim() == wanted
    {
        return Ok(());
    }
    eprintln!("xtask: installing {wanted} from crates.io");
    if !crate::cargo(&["install", "cargo-mutants", "--locked", "--version", CARGO_MUTANTS], &[]).await? {
        bail!("cannot install {wanted}");
    }
    Ok(())
}

/// Refuses to mutate a file with uncommitted changes: cargo-mutants puts back what it found.
async fn unchanged(root: &Path, guards: &[&Guard]) -> anyhow::Result<()> {
    let mut args = vec!["status", "--porcelain", "--"];
    args.extend(guards.iter().map(|guard| guard.file));
    let output = Command::new("git").args(&args).current_dir(root).output().await.context("cannot run git")?;
    let changed = String::from_utf8_lossy(&output.stdout);
    ensure!(changed.trim().is_empty(), "commit or stash the changes to the guards' files first:\n{changed}");
    Ok(())
}

/// Runs cargo-mutants on one guard: first the guard's tests on the unmutated tree, which must pass
/// (in CI, after the whole suite has passed, this is skipped), then every mutant.
///
/// The baseline is run here rather than by cargo-mutants, whose own baseline runs the tests of the
/// mutated package instead of `--test-package`'s.
async fn run(root: &Path, guard: &Guard, url: &str, ci: bool) -> anyhow::Result<Outcome> {
    let output = crate::target_dir(root).join("mutants").join(guard.name);
    std::fs::create_dir_all(&output).with_context(|| format!("cannot create {}", output.display()))?;
    let output_str = output.to_string_lossy();
    let env = [("SQLX_OFFLINE", "true"), ("DATABASE_URL", url)];
    let started = Instant::now();
    // A mutant whose tests run five times as long as the unmutated tree's (at least a minute) is
    // stopped and counted as a survivor, since a hang caught nothing.
    let timeout = if ci {
        300
    } else {
        let packages = guard.packages.join(", ");
        eprintln!("xtask: {}: the tests of {packages} matching {} on the unmutated tree", guard.name, guard.tests);
        let mut baseline = vec!["nextest", "run", "--locked"];
        baseline.extend(guard.packages.iter().flat_map(|package| ["--package", package]));
        baseline.extend(["-E", guard.tests]);
        ensure!(crate::cargo(&baseline, &env).await?, "{}: the guard's tests fail on the unmutated tree", guard.name);
        (started.elapsed().as_secs() * 5).max(60)
    };
    let timeout = timeout.to_string();
    // CI tries one mutant of the guard: the guard gone, which a refactor could do unseen.
    let functions = if ci { guard.ci.unwrap_or(guard.functions) } else { guard.functions };
    eprintln!("xtask: {}: mutating {functions} in {}", guard.name, guard.file);
    let status = Command::new("cargo")
        .args(["mutants", "--in-place", "--no-shuffle", "--test-tool", "nextest", "--colors", "never"])
        .args(["--file", guard.file, "--re", functions])
        .args(guard.packages.iter().flat_map(|package| ["--test-package", package]))
        .args(["--baseline", "skip", "--timeout", &timeout])
        .args(["--output", &output_str, "--", "-E", guard.tests])
        .envs(env)
        .current_dir(root)
        .status()
        .await
        .context("cannot run cargo mutants")?;
    // 0: every mutant caught; 2: some missed; 3: some timed out. Anything else (the unmutated tree
    // failing its tests, a bad argument) leaves nothing to count.
    ensure!(
        matches!(status.code(), Some(0 | 2 | 3)),
        "cargo mutants on {} ended with {status}; see {}",
        guard.name,
        output.join("mutants.out").display()
    );
    // cargo-mutants 27.1.0 applies `--re` to every mutant but the deletion of a field from a struct
    // expression; those of other functions than the guard's are left out here.
    // cargo-mutants' own summary counts them; the line below says which were dropped.
    let guarded = regex::Regex::new(functions).context("a guard's functions are not a regular expression")?;
    let read = |file: &str| -> anyhow::Result<Vec<String>> {
        let path = output.join("mutants.out").join(file);
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let (ours, others): (Vec<&str>, Vec<&str>) =
            text.lines().filter(|line| !line.trim().is_empty()).partition(|line| guarded.is_match(line));
        for other in others {
            eprintln!("xtask: {}: left out, not in the guard's functions ({file}): {other}", guard.name);
        }
        Ok(ours.into_iter().map(str::to_owned).collect())
    };
    let outcome = Outcome {
        name: guard.name,
        caught: read("caught.txt")?.len(),
        missed: read("missed.txt")?,
        timed_out: read("timeout.txt")?,
        unviable: read("unviable.txt")?.len(),
        seconds: started.elapsed().as_secs(),
    };
    ensure!(
        outcome.caught + outcome.missed.len() + outcome.timed_out.len() > 0,
        "{}: no mutant was tried; does {} still hold {}?",
        guard.name,
        guard.file,
        guard.functions
    );
    Ok(outcome)
}

/// Prints one line per guard and the totals.
fn report(outcomes: &[Outcome], seconds: u64) {
    eprintln!("\n{:<20} {:>7} {:>7} {:>7} {:>9} {:>9}", "guard", "mutants", "caught", "missed", "unviable", "seconds");
    for outcome in outcomes {
        eprintln!(
            "{:<20} {:>7} {:>7} {:>7} {:>9} {:>9}",
            outcome.name,
            outcome.caught + outcome.missed.len() + outcome.timed_out.len() + outcome.unviable,
            outcome.caught,
            outcome.missed.len() + outcome.timed_out.len(),
            outcome.unviable,
            outcome.seconds
        );
    }
    eprintln!("all guards in {seconds} s");
}
