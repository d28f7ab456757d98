//! XCLOAK.ALLOW/PEEK in a real Redis Cluster: routing by key, hash tags,
//! `redis-cli -c`, and live resharding.
mod common;
use common::cluster::*;
use common::*;

#[test]
fn cluster_routes_by_key() {
    let cluster = Cluster::start(3, 1);
    let mut conn = cluster.client();
    let admitted: i64 = redis::cmd("XCLOAK.ALLOW").arg("a").arg(60_000).arg(2).query(&mut conn).unwrap();
    assert_eq!(admitted, 1);
}
