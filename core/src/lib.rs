//! xcloak's pure core: everything the Redis module decides and stores that
//! needs no server, tested and fuzzed without one, and run under Miri.
//!
//! [`grammar`] declares each command once (its words, ranges, flags and doc
//! text, from which the parser, the registration and `COMMAND DOCS` are
//! generated); [`args`] parses a command line into a typed request from it,
//! strictly, with every error naming its argument and range; [`window`] takes the sliding-window
//! decision over a small [`window::Log`] trait; [`log`] is the compact form's
//! log (bit-packed blocks of runs, an index of blocks for large windows) and
//! its two canonical encodings; [`member`] is the sorted-set form's member
//! format; [`effect`] is the text of a replicated effect; [`decimal`] writes
//! the integers members and effects carry. No file here
//! touches the module API: the module crate (`src/`) stores these logs as
//! values of its data type and answers with these decisions.
//!
//! `unsafe` is denied but in the files that own an allocation by a raw
//! pointer (a window is one pointer, stored as the server's value: see
//! `log/block.rs`, `log/large.rs`, `log/runlog.rs`), each use with a
//! `// SAFETY:` line; `cargo +nightly miri test -p xcloak-core` checks them.
#![deny(unsafe_code)]

#[allow(unsafe_code)] // `Tiers`: a list filled only as far as given
pub mod args;
pub mod decimal;
pub mod effect;
pub mod grammar;
pub mod log;
pub mod member;
pub mod window;
