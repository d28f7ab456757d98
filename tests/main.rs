//! The integration suite: one test binary whose modules are the files of
//! `tests/` (each starts real servers with the module; see `common`).
//!
//! One binary, so the harness (`common`) and the dependencies are compiled and
//! linked once, not once per file. Pick tests by module path:
//!
//! - `cargo test --test integration`: every file;
//! - `cargo test --test integration -- faults::`: one file (`tests/faults.rs`);
//! - `cargo test --test integration -- memcheck:: hostile_restore::`: several.
//!
//! A new file in `tests/` runs only once it is declared here (`autotests = false`
//! in Cargo.toml); `hygiene::every_test_file_is_a_module_of_the_suite` fails until then.
//! The list of files the compatibility matrix runs on the other servers is
//! `matrix.list` (its comments say why each is there).

mod common;

mod acl;
mod allow_semantics;
mod clock;
mod cluster;
mod compact_type;
mod conformance;
mod diskless_short_reads;
mod events_failover;
mod events_keyspace;
mod events_lfu;
mod events_notifications;
mod events_pause;
mod events_scripts;
mod events_tracking;
mod events_watch;
mod eviction;
mod examples;
mod failover;
mod faults;
mod fixtures;
mod grammar;
mod hostile;
mod hostile_restore;
mod hygiene;
mod layout;
mod lua_fallback;
mod memcheck;
mod memory;
mod metadata;
mod model;
mod oracle_diff;
mod panic_safety;
mod peek;
mod persistence;
mod race;
mod refund;
mod replication;
mod replication_stream;
mod smoke;
mod soak;
mod storage_diff;
