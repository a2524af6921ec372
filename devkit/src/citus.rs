//! A throwaway Citus cluster: a coordinator and two worker nodes, each a [`Cluster`] with Citus
//! preloaded, from a Citus that is already installed for the server. Nothing here installs Citus.
//!
//! Clients connect to the coordinator only. [`CitusCluster::create_database`] makes a database on
//! every node, creates the extension in each, and tells the coordinator where it and the workers
//! are, which is all `oncepay-reconciler migrate` needs to distribute the tables.

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::pg::{self, Cluster, Durability};

/// How many worker nodes a cluster has.
pub const WORKERS: usize = 2;

/// A running coordinator and its worker nodes.
pub struct CitusCluster {
    coordinator: Cluster,
    workers: Vec<Cluster>,
}

/// Whether Citus is installed for the server the clusters run on: `Ok` with its library, or an
/// error that says what is missing.
pub async fn installed() -> anyhow::Result<PathBuf> {
    let library = pg::library_dir().await?.join("citus.so");
    if !library.is_file() {
        bail!(
            "Citus is not installed for this PostgreSQL: there is no {}. Install Citus for this server \
             (it is not packaged for every distribution; see SCALING.md) to run oncepay on it",
            library.display()
        );
    }
    Ok(library)
}

impl CitusCluster {
    /// Starts a coordinator and [`WORKERS`] worker nodes; fails with a clear message when Citus is
    /// not installed.
    pub async fn start(durability: Durability) -> anyhow::Result<Self> {
        installed().await?;
        // The nodes talk to each other over loopback without TLS: with it, libpq inside the server
        // would look for a client certificate in the home directory of whoever started the test.
        let settings = [("shared_preload_libraries", "citus"), ("citus.node_conninfo", "sslmode=disable")];
        let coordinator =
            Cluster::start_with(durability, &settings).await.context("cannot start the Citus coordinator")?;
        let mut workers = Vec::with_capacity(WORKERS);
        for index in 0..WORKERS {
            let worker = Cluster::start_with(durability, &settings)
                .await
                .with_context(|| format!("cannot start Citus worker node {index}"))?;
            workers.push(worker);
        }
        Ok(Self { coordinator, workers })
    }

    /// The coordinator, where every client connects.
    pub fn coordinator(&self) -> &Cluster {
        &self.coordinator
    }

    /// The coordinator, to stop and start it again.
    pub fn coordinator_mut(&mut self) -> &mut Cluster {
        &mut self.coordinator
    }

    /// The worker nodes.
    pub fn workers(&self) -> &[Cluster] {
        &self.workers
    }

    /// The worker node `index`, to stop and start it again.
    pub fn worker_mut(&mut self, index: usize) -> Option<&mut Cluster> {
        self.workers.get_mut(index)
    }

    /// A URL for `database` on the coordinator.
    pub fn url(&self, database: &str) -> String {
        self.coordinator.url(database)
    }

    /// Creates `name` on every node with the `citus` extension in it, and registers the coordinator
    /// and the worker nodes in the coordinator's metadata for that database.
    pub async fn create_database(&self, name: &str) -> anyhow::Result<()> {
        for node in std::iter::once(&self.coordinator).chain(&self.workers) {
            node.create_database(name).await?;
            node.psql(name, "CREATE EXTENSION citus").await?;
        }
        self.coordinator
            .psql(name, &format!("SELECT citus_set_coordinator_host('127.0.0.1', {})", self.coordinator.port()))
            .await?;
        for worker in &self.workers {
            self.coordinator.psql(name, &format!("SELECT citus_add_node('127.0.0.1', {})", worker.port())).await?;
        }
        Ok(())
    }
}
