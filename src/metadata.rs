//! What the server tells clients and operators about the commands, generated
//! from the grammar (`xcloak_core::grammar`, where each command is declared
//! once): `COMMAND DOCS` / `COMMAND INFO` (Redis 7.0+, Valkey) and the ACL
//! categories (Redis 7.2+, Valkey).
//!
//! This file maps the grammar's table to the server's terms (argument types,
//! key and argument flags, C strings, each summary rendered from the ranges it
//! states); `ffi/command_info.rs` lays that out as the C structures and hands
//! them to the server.

use std::ffi::{c_int, CString};

use redis_module::raw;
use xcloak_core::grammar::{self, Arg, Command, KeyFlags, Kind};

use crate::ffi::command_info::{self, Applied, DocArg, Docs};

/// Attaches the documentation of `command` to it, already created. Call from
/// `OnLoad` only. An `Err` carries a message for the log; the command itself
/// still works.
pub fn describe(ctx: *mut raw::RedisModuleCtx, command: &Command) -> Result<Applied, String> {
    command_info::apply(ctx, &docs(command))
}

/// The documentation of `command`, in the server's terms.
pub fn docs(command: &Command) -> Docs {
    Docs {
        name: text(command.name),
        summary: text(command.summary),
        complexity: text(command.complexity),
        since: text(grammar::SINCE),
        tips: command.tips.map(text),
        arity: command.arity as c_int,
        key_flags: key_flags(command.key_flags),
        key_position: command.key_position() as c_int,
        acl_categories: text(command.acl_categories),
        args: command.args.iter().map(doc_arg).collect(),
    }
}

fn doc_arg(arg: &Arg) -> DocArg {
    let mut flags = 0;
    if arg.optional {
        flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL;
    }
    if arg.times > 1 {
        flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE | raw::REDISMODULE_CMD_ARG_MULTIPLE_TOKEN;
    }
    DocArg {
        name: text(arg.name),
        type_: arg_type(arg.kind),
        key_spec_index: if arg.kind == Kind::Key { 0 } else { -1 },
        token: arg.token.map(|token| text(token.word())),
        summary: text(&arg.summary()),
        flags: flags as c_int,
        block: arg.block().iter().map(doc_arg).collect(),
    }
}

fn arg_type(kind: Kind) -> raw::RedisModuleCommandArgType {
    match kind {
        Kind::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
        Kind::OneOf(_) => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
        Kind::Integer(_) => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
        Kind::UnixTime(_) => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_UNIX_TIME,
        Kind::PureToken => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
        Kind::Block(_) => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
    }
}

/// `REDISMODULE_CMD_KEY_*` of the grammar's key flags, one to one.
fn key_flags(flags: KeyFlags) -> u64 {
    [
        (KeyFlags::RW, raw::REDISMODULE_CMD_KEY_RW),
        (KeyFlags::RO, raw::REDISMODULE_CMD_KEY_RO),
        (KeyFlags::ACCESS, raw::REDISMODULE_CMD_KEY_ACCESS),
        (KeyFlags::UPDATE, raw::REDISMODULE_CMD_KEY_UPDATE),
        (KeyFlags::DELETE, raw::REDISMODULE_CMD_KEY_DELETE),
    ]
    .into_iter()
    .filter(|(flag, _)| flags.contains(*flag))
    .fold(0, |bits, (_, raw)| bits | u64::from(raw))
}

/// A C string of the grammar's text, which holds no NUL (the tests of this file check it).
pub fn text(text: &str) -> CString {
    CString::new(text).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every grammar text becomes its C string whole (a NUL would empty it),
    /// and each key flag maps to a distinct server flag.
    #[test]
    fn every_text_maps_whole_and_every_flag_to_its_own_bit() {
        fn check_args(args: &[Arg]) {
            for arg in args {
                let doc = doc_arg(arg);
                assert_eq!(doc.name.to_str().unwrap(), arg.name);
                assert_eq!(doc.summary.to_str().unwrap(), arg.summary());
                check_args(arg.block());
            }
        }
        for command in grammar::COMMANDS {
            let docs = docs(command);
            assert_eq!(docs.summary.to_str().unwrap(), command.summary);
            assert_eq!(docs.acl_categories.to_str().unwrap(), command.acl_categories);
            check_args(command.args);
        }
        let bits: Vec<u64> = KeyFlags::ALL.iter().map(|flag| key_flags(*flag)).collect();
        for (i, bit) in bits.iter().enumerate() {
            assert_eq!(bit.count_ones(), 1);
            assert!(!bits[..i].contains(bit));
        }
    }
}
