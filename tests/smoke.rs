//! The module loads and answers; the harness works.
use crate::common;
use common::*;

#[test]
fn module_loads_and_admits_up_to_the_limit() {
    let server = Server::start();
    let mut conn = server.client();
    let replies: Vec<i64> = (0..4)
        .map(|_| {
            redis::cmd("XCLOAK.ALLOW")
                .arg("k")
                .arg(60_000)
                .arg(3)
                .query(&mut conn)
                .unwrap()
        })
        .collect();
    assert_eq!(replies, [1, 1, 1, 0]);
    let card: i64 = redis::cmd("ZCARD").arg("k").query(&mut conn).unwrap();
    assert_eq!(card, 3);
}
