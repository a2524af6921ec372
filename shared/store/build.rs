//! Rebuilds the store when a migration is added: `sqlx::migrate!` embeds the migrations at compile
//! time, and without this cargo does not notice a new file in the directory.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
