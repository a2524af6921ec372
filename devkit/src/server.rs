//! The database server a task or a cross-process test runs oncepay on: one throwaway PostgreSQL
//! ([`Cluster`]), or a throwaway Citus cluster ([`CitusCluster`]) when asked for. Either way,
//! clients get one URL, and `oncepay-reconciler migrate` lays the schema out for what it finds.

use std::path::PathBuf;

use anyhow::Context;

use crate::citus::CitusCluster;
use crate::pg::{Cluster, Durability};

/// The variable that chooses the server of the cross-process tests: `citus` for a Citus cluster
/// (`cargo xtask test --citus` sets it), anything else or nothing for one PostgreSQL. Not
/// `ONCEPAY_…`: oncepay's processes read those as their configuration.
pub const VARIABLE: &str = "TEST_DATABASE";

/// Which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One PostgreSQL.
    Single,
    /// A Citus coordinator and its worker nodes.
    Citus,
}

impl Kind {
    /// What [`VARIABLE`] asks for.
    pub fn from_env() -> Self {
        match std::env::var(VARIABLE) {
            Ok(value) if value == "citus" => Self::Citus,
            _ => Self::Single,
        }
    }
}

/// A running server.
pub enum Server {
    /// One PostgreSQL.
    Single(Cluster),
    /// A Citus cluster; clients connect to its coordinator.
    Citus(CitusCluster),
}

impl Server {
    /// Starts a server of `kind`.
    pub async fn start(kind: Kind, durability: Durability) -> anyhow::Result<Self> {
        Ok(match kind {
            Kind::Single => Self::Single(Cluster::start(durability).await?),
            Kind::Citus => Self::Citus(CitusCluster::start(durability).await?),
        })
    }

    /// Under Citus, makes the coordinator keep its record of every transaction it commits with
    /// two-phase commit (`pg_dist_transaction`), which it otherwise clears every minute, so that a
    /// test can count them. For tests only: a cluster that keeps them also never recovers a prepared
    /// transaction left by a crash. Does nothing on one PostgreSQL.
    pub async fn keep_two_phase_records(&self) -> anyhow::Result<()> {
        if let Self::Citus(citus) = self {
            let coordinator = citus.coordinator();
            coordinator.psql("postgres", "ALTER SYSTEM SET citus.recover_2pc_interval = -1").await?;
            coordinator.psql("postgres", "SELECT pg_reload_conf()").await?;
        }
        Ok(())
    }

    /// The cluster clients connect to: the only one, or the coordinator.
    pub fn front(&self) -> &Cluster {
        match self {
            Self::Single(cluster) => cluster,
            Self::Citus(citus) => citus.coordinator(),
        }
    }

    /// Every node: the one PostgreSQL, or the coordinator followed by the worker nodes.
    pub fn nodes(&self) -> Vec<&Cluster> {
        match self {
            Self::Single(cluster) => vec![cluster],
            Self::Citus(citus) => std::iter::once(citus.coordinator()).chain(citus.workers()).collect(),
        }
    }

    /// What it is, for a report: `one PostgreSQL` or `Citus: a coordinator and 2 worker nodes`.
    pub fn describe(&self) -> String {
        match self {
            Self::Single(_) => "one PostgreSQL".to_owned(),
            Self::Citus(citus) => format!("Citus: a coordinator and {} worker nodes", citus.workers().len()),
        }
    }

    fn front_mut(&mut self) -> &mut Cluster {
        match self {
            Self::Single(cluster) => cluster,
            Self::Citus(citus) => citus.coordinator_mut(),
        }
    }

    /// Creates `name`, ready for `migrate` (on Citus: on every node, with the extension).
    pub async fn create_database(&self, name: &str) -> anyhow::Result<()> {
        match self {
            Self::Single(cluster) => cluster.create_database(name).await,
            Self::Citus(citus) => citus.create_database(name).await,
        }
    }

    /// A URL for `database`, as the superuser.
    pub fn url(&self, database: &str) -> String {
        self.front().url(database)
    }

    /// A URL for `database`, as `role`.
    pub fn url_as(&self, role: &str, database: &str) -> String {
        self.front().url_as(role, database)
    }

    /// The log of the server clients connect to.
    pub fn log_path(&self) -> PathBuf {
        self.front().log_path()
    }

    /// Crashes the server clients connect to (`pg_ctl stop -m immediate`).
    pub async fn crash(&mut self) -> anyhow::Result<()> {
        self.front_mut().crash().await
    }

    /// Stops the server clients connect to cleanly.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.front_mut().stop().await
    }

    /// How many worker nodes hold the data: none on one PostgreSQL.
    pub fn worker_nodes(&self) -> usize {
        match self {
            Self::Single(_) => 0,
            Self::Citus(citus) => citus.workers().len(),
        }
    }

    /// Crashes worker node `index` (`pg_ctl stop -m immediate`); the coordinator stays up.
    pub async fn crash_worker_node(&mut self, index: usize) -> anyhow::Result<()> {
        self.worker_node(index)?.crash().await
    }

    /// Starts worker node `index` again after [`Server::crash_worker_node`].
    pub async fn resume_worker_node(&mut self, index: usize) -> anyhow::Result<()> {
        self.worker_node(index)?.resume().await
    }

    fn worker_node(&mut self, index: usize) -> anyhow::Result<&mut Cluster> {
        match self {
            Self::Single(_) => anyhow::bail!("one PostgreSQL has no worker nodes"),
            Self::Citus(citus) => citus.worker_mut(index).with_context(|| format!("there is no worker node {index}")),
        }
    }

    /// Starts it again after [`Server::crash`] or [`Server::stop`]; it recovers from its WAL.
    pub async fn resume(&mut self) -> anyhow::Result<()> {
        self.front_mut().resume().await
    }
}
