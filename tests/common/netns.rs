//! Hosts on one machine, for faults that cross a network: each host is a
//! network namespace (`ip netns`, Debian's iproute2) with one veth link to a
//! bridge in the test's own namespace, which keeps its address `.1`.
//!
//! ```ignore
//! let net = Network::create(3)?;               // Err(why) without CAP_NET_ADMIN
//! let config = ServerConfig::default().in_host(&net.hosts[0]);   // redis-server inside
//! net.hosts[0].cut();                          // its link down: isolated from all
//! net.hosts[0].heal();
//! net.hosts[0].block(&net.hosts[1].addr);      // with the same on host 1: only those two cut apart
//! net.hosts[0].enter_this_thread();            // this thread's sockets now live there
//! ```
//!
//! A cut host still reaches its own address (through its loopback), so a
//! client thread that entered its namespace keeps talking to a server there:
//! the minority side of a partition. Names and the subnet are derived from
//! the process id, so runs in parallel do not collide; everything is deleted
//! on drop (servers first: drop them before the network).

use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::Arc;

/// One namespace with one address on the bridge.
pub struct Host {
    pub ns: String,
    /// Its address, as the other hosts and the test reach it.
    pub addr: String,
    /// The link's end in the test's namespace (set down to cut the host off).
    root_end: String,
}

pub struct Network {
    pub hosts: Vec<Arc<Host>>,
    bridge: String,
    /// The test's own address on the bridge (`a.b.c.1`), reachable from every host.
    pub gateway: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

impl Network {
    /// `count` hosts on one bridge, or why they can't be made here (not
    /// root, no `ip`, no veth/bridge support), with nothing left behind.
    pub fn create(count: usize) -> Result<Network, String> {
        let pid = std::process::id();
        let tag = format!("{}", pid % 1_000_000);
        // 10.(100..=199).(0..=255).0/24, from the pid.
        let subnet = format!("10.{}.{}", 100 + (pid / 256) % 100, pid % 256);
        let mut network = Network {
            hosts: Vec::new(),
            bridge: format!("xcb{tag}"),
            gateway: format!("{subnet}.1"),
        };
        ip(&["link", "add", &network.bridge, "type", "bridge"])?;
        let built = (|| {
            ip(&[
                "addr",
                "add",
                &format!("{}/24", network.gateway),
                "dev",
                &network.bridge,
            ])?;
            ip(&["link", "set", &network.bridge, "up"])?;
            for i in 0..count {
                let host = Host {
                    ns: format!("xcn{tag}h{i}"),
                    addr: format!("{subnet}.{}", 10 + i),
                    root_end: format!("xcr{tag}h{i}"),
                };
                let inner = format!("xci{tag}h{i}");
                ip(&["netns", "add", &host.ns])?;
                network.hosts.push(Arc::new(host));
                let host = network.hosts.last().unwrap();
                ip(&["link", "add", &host.root_end, "type", "veth", "peer", "name", &inner])?;
                ip(&["link", "set", &inner, "netns", &host.ns])?;
                ip(&["link", "set", &host.root_end, "master", &network.bridge, "up"])?;
                let exec = |args: &[&str]| {
                    let mut all = vec!["netns", "exec", host.ns.as_str(), "ip"];
                    all.extend_from_slice(args);
                    ip(&all)
                };
                exec(&["addr", "add", &format!("{}/24", host.addr), "dev", &inner])?;
                exec(&["link", "set", &inner, "up"])?;
                exec(&["link", "set", "lo", "up"])?;
            }
            Ok::<(), String>(())
        })();
        // On an error `network` is dropped, which deletes what was made.
        built.map(|()| network)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for host in &self.hosts {
            let _ = ip(&["link", "del", &host.root_end]);
            let _ = ip(&["netns", "del", &host.ns]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

impl Host {
    /// Takes the host's link down: no packet in or out until `heal`.
    pub fn cut(&self) {
        ip(&["link", "set", &self.root_end, "down"]).expect("cut the link");
    }

    pub fn heal(&self) {
        ip(&["link", "set", &self.root_end, "up"]).expect("heal the link");
    }

    /// Drops what this host sends to `addr` (a blackhole route): with the
    /// same on the other host, a partition between the two alone, while
    /// both still reach everyone else.
    pub fn block(&self, addr: &str) {
        ip(&[
            "netns",
            "exec",
            &self.ns,
            "ip",
            "route",
            "add",
            "blackhole",
            &format!("{addr}/32"),
        ])
        .expect("block an address");
    }

    pub fn unblock(&self, addr: &str) {
        ip(&[
            "netns",
            "exec",
            &self.ns,
            "ip",
            "route",
            "del",
            "blackhole",
            &format!("{addr}/32"),
        ])
        .expect("unblock an address");
    }

    /// Moves the calling thread into this host's namespace: the sockets it
    /// opens from now on live there. Returns a guard that moves it back.
    pub fn enter_this_thread(&self) -> ThreadInNamespace {
        let own = std::fs::File::open("/proc/thread-self/ns/net").expect("this thread's namespace");
        let target = std::fs::File::open(format!("/var/run/netns/{}", self.ns)).expect("the host's namespace");
        // SAFETY: setns on a valid namespace fd affects only the calling thread.
        let status = unsafe { libc::setns(target.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(status, 0, "setns into {}: {}", self.ns, std::io::Error::last_os_error());
        ThreadInNamespace { own }
    }
}

/// A thread inside another namespace; dropping it moves the thread back.
pub struct ThreadInNamespace {
    own: std::fs::File,
}

impl Drop for ThreadInNamespace {
    fn drop(&mut self) {
        // SAFETY: as in enter_this_thread.
        unsafe { libc::setns(self.own.as_raw_fd(), libc::CLONE_NEWNET) };
    }
}
