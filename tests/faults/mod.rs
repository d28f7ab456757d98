//! The fault harness (see `tests/faults.rs`): the load and its history, the
//! snapshots, the faults, the checker and the report.
pub mod checker;
pub mod history;
pub mod load;
pub mod report;
pub mod resp;
pub mod scenarios;
pub mod snapshots;
