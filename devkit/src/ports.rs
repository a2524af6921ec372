//! Ports for the servers the tasks, tests and benchmarks start, reserved so that no two of them
//! are ever given the same one.
//!
//! Asking the kernel for a free port (binding port 0 and letting go) is a race: the port is free
//! again the moment it is read, so another test process may be given it too, and the server that
//! binds second fails while a health check finds the other one and calls it ready. [`reserve`]
//! instead takes a port below the kernel's ephemeral range, where neither port 0 nor an outgoing
//! connection draws from, and holds a lock on a file named after it in a directory every process
//! shares, until the process that reserved it exits. The files stay, empty, one per port ever
//! reserved.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::{Context, bail};

/// The lowest port handed out; below it are the well-known and commonly configured ports.
const LOWEST: u16 = 15_000;

/// Used when the kernel's ephemeral range cannot be read: Linux's default lower bound.
const DEFAULT_EPHEMERAL_START: u16 = 32_768;

/// The locks this process holds, one per port it reserved; they are released when it exits.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// A port on 127.0.0.1 that nothing listens on now and that no other caller of this function, in
/// this process or any other on the machine, is given until this process exits.
pub fn reserve() -> anyhow::Result<u16> {
    let dir = std::env::temp_dir().join("oncepay-ports");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let (lowest, end) = (LOWEST, ephemeral_start().max(LOWEST + 1));
    let span = usize::from(end - lowest);
    for port in (lowest..end).cycle().skip(first_try(span)).take(span) {
        let Some(lock) = try_lock(dir.join(port.to_string()))? else { continue };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            HELD.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(lock);
            return Ok(port);
        }
    }
    bail!("every port from {lowest} to {end} is reserved or in use")
}

/// Where in the span this process starts looking, different for each process and each call so that
/// processes starting together do not contend for the same few locks.
fn first_try(span: usize) -> usize {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.subsec_nanos());
    let mixed = std::process::id().wrapping_mul(7_919).wrapping_add(nanos);
    usize::try_from(mixed).unwrap_or_default() % span
}

/// The lowest port of the kernel's ephemeral range.
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(DEFAULT_EPHEMERAL_START)
}

/// An exclusive lock on `path`, or `None` when another holder has it.
fn try_lock(path: PathBuf) -> anyhow::Result<Option<File>> {
    // Read-only is enough to lock, and works on a file another user created.
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == ErrorKind::NotFound => OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?,
        Err(error) => return Err(error).with_context(|| format!("cannot open {}", path.display())),
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(error)) => {
            Err(error).with_context(|| format!("cannot lock {}", path.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_port_lies_below_the_ephemeral_range_where_the_kernel_hands_out_free_ports() {
        let port = reserve().unwrap();
        assert!((LOWEST..ephemeral_start()).contains(&port), "{port} is not below {}", ephemeral_start());
    }

    #[test]
    fn a_port_is_reserved_once_and_its_lock_keeps_every_other_process_from_it() {
        let ports: Vec<u16> = (0..50).map(|_| reserve().unwrap()).collect();
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), ports.len(), "a port was reserved twice: {ports:?}");
        // A second opening of the file, as another process's would be, finds it locked.
        let path = std::env::temp_dir().join("oncepay-ports").join(ports[0].to_string());
        let other = File::open(path).unwrap();
        assert!(matches!(other.try_lock(), Err(std::fs::TryLockError::WouldBlock)));
    }
}
