//! A DC of three real `tandem server` processes (`[cluster]`, docs/cluster.md): writes on
//! any node (a follower forwards to the leader and answers once its own apply reached the
//! write), reads on every node, and the leader killed with SIGKILL under a stream of
//! writes: every acknowledged write is on every surviving node and on the killed one once
//! it is back, writes are accepted again within a bound, and a lease that kept beating
//! through a follower does not expire.

#[path = "cluster/backup.rs"]
mod backup;
mod common;
#[path = "cluster/quiet.rs"]
mod quiet;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use tandem_client::client::Client;

const DC: &str = "dc-a";
const NODES: u64 = 3;
/// Longest a DC may go without accepting writes after its leader dies, in this test (the
/// election timeout here is 300..600 ms; the goal with defaults is a p99 of 2 s).
const WRITE_GAP_MAX: Duration = Duration::from_secs(5);

struct Member {
    id: u64,
    http: String,
    server: ServerProc,
}

impl Member {
    fn client(&self) -> Client {
        Client::new(std::slice::from_ref(&self.http))
    }

    fn running(&self) -> bool {
        self.server.running()
    }
}

/// Writes certificates and configs for a DC of three, and starts them.
fn start_dc(dir: &Path) -> Vec<Member> {
    let certs = dir.join("certs");
    tandem_replicator::tls::generate_dev_pki(&certs, &[DC], false).unwrap();
    start_members(dir, &|_| String::new())
}

/// Writes node certificates and configs for a DC of three (the DC's CA in `dir/certs`),
/// each config ending with `extra(i)` for member index `i`, and starts them.
fn start_members(dir: &Path, extra: &dyn Fn(usize) -> String) -> Vec<Member> {
    let certs = dir.join("certs");
    let ids: Vec<u64> = (1..=NODES).collect();
    let node_certs = tandem_replicator::tls::generate_dev_node_certs(&certs, DC, &ids, false).unwrap();
    let http: Vec<u16> = ids.iter().map(|_| free_tcp_port()).collect();
    let raft: Vec<u16> = ids.iter().map(|_| free_udp_port()).collect();
    let members: String = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            format!(
                "{{ id = {id}, raft_addr = \"127.0.0.1:{}\", http_addr = \"127.0.0.1:{}\" }}, ",
                raft[i], http[i]
            )
        })
        .collect();
    ids.iter()
        .enumerate()
        .map(|(i, id)| {
            let paths = &node_certs[i].1;
            let config = dir.join(format!("n{id}.toml"));
            let body = format!(
                "dc = \"{DC}\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:{}\"\n\
                 [health]\ncheck_interval_ms = 50\nheartbeat_interval_ms = 200\nsuspect_after_ms = 1500\n\
                 unhealthy_after_ms = 2500\nexpire_after_ms = 4000\n\
                 [protection]\nself_preservation_threshold = 0.0\n\
                 [cluster]\nnode_id = {id}\nmembers = [{members}]\n\
                 ca_cert = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
                 heartbeat_interval_ms = 50\nelection_timeout_min_ms = 300\nelection_timeout_max_ms = 600\n{}",
                dir.join(format!("n{id}")).display(),
                http[i],
                paths.ca_cert.display(),
                paths.cert.display(),
                paths.key.display(),
                extra(i),
            );
            std::fs::write(&config, body).unwrap();
            let mut m = Member {
                id: *id,
                http: format!("http://127.0.0.1:{}", http[i]),
                server: ServerProc::new(config, "info"),
            };
            m.server.start();
            m
        })
        .collect()
}

/// A DC of three started in `dir`, its serving leader, and ten persistent registrations
/// of `web` (w0..w9) acknowledged by the leader.
async fn dc_with_ten_writes(dir: &Path) -> (Vec<Member>, u64) {
    let members = start_dc(dir);
    let leader = serving_leader(&members).await;
    let c = members[(leader - 1) as usize].client();
    for i in 0..10 {
        c.register(&reg_body("web", &format!("w{i}"), true)).await.unwrap();
    }
    (members, leader)
}

/// The `cluster` part of a node's status, when it answers.
async fn group_status(m: &Member) -> Option<Value> {
    m.client().status().await.ok().map(|s| s["cluster"].clone())
}

/// The member that leads and serves writes, once every running member agrees on it.
async fn serving_leader(members: &[Member]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut seen = Vec::new();
        for m in members.iter().filter(|m| m.running()) {
            seen.push((m.id, group_status(m).await));
        }
        let leaders: BTreeSet<Option<u64>> =
            seen.iter().map(|(_, s)| s.as_ref().and_then(|s| s["leader"].as_u64())).collect();
        if let [Some(leader)] = leaders.iter().copied().collect::<Vec<_>>()[..] {
            let serving = seen
                .iter()
                .any(|(id, s)| *id == leader && s.as_ref().is_some_and(|s| s["serving_writes"] == true));
            if serving {
                return leader;
            }
        }
        assert!(Instant::now() < deadline, "no agreed, serving leader: {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn ids_of(answer: &Value) -> BTreeSet<String> {
    ids(answer).into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dc_of_three_loses_no_acknowledged_write_when_its_leader_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = start_dc(dir.path());
    let leader = serving_leader(&members).await;
    let follower = members.iter().position(|m| m.id != leader).unwrap();

    // A write on a follower: forwarded, and readable on that follower at once.
    let c = members[follower].client();
    c.register(&reg_body("web", "first", true)).await.expect("a follower forwards a write to the leader");
    let seen = c.discover("default", "web", "").await.unwrap();
    assert!(ids_of(&seen).contains("first"), "read-your-write on the follower: {seen}");
    for m in &members {
        eventually(Duration::from_secs(10), "every member applies the write", || async {
            m.client().discover("default", "web", "").await.is_ok_and(|a| ids_of(&a).contains("first"))
        })
        .await;
    }

    // A consistent read on the other follower sees every write acknowledged before it
    // (a read index from the leader, then its own apply), and a member's answers say
    // whether it knows a leader and when it last heard from it.
    let other = members.iter().position(|m| m.id != leader && m.id != members[follower].id).unwrap();
    for i in 0..20 {
        let id = format!("c{i}");
        c.register(&reg_body("web", &id, true)).await.unwrap();
        let seen = members[other].client().discover("default", "web", "consistent=true").await.unwrap();
        assert!(ids_of(&seen).contains(&id), "a consistent read misses {id}: {seen}");
    }
    let answer = reqwest::get(format!("{}/v1/services/default/web", members[other].http)).await.unwrap();
    assert_eq!(answer.headers()["x-tandem-known-leader"], "true");
    let contact: u64 = answer.headers()["x-tandem-last-contact"].to_str().unwrap().parse().unwrap();
    assert!(contact < 1_000, "a follower heard from its leader {contact} ms ago");

    // An ephemeral instance beating through the followers all along, and one that never
    // beats: the new leader must keep the first (its lease restarts with a full TTL) and
    // expire the second (it holds a lease for it although it never minted it).
    c.register(&reg_body("beat", "b1", false)).await.unwrap();
    c.register(&reg_body("silent", "s1", false)).await.unwrap();
    let beating = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let beater = {
        let beating = beating.clone();
        let addrs: Vec<String> = members.iter().filter(|m| m.id != leader).map(|m| m.http.clone()).collect();
        tokio::spawn(async move {
            let clients: Vec<Client> = addrs.iter().map(|a| Client::new(std::slice::from_ref(a))).collect();
            let mut n = 0usize;
            while beating.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = clients[n % clients.len()].heartbeat("default", "beat", "b1").await;
                n += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    // A stream of writes to every node in turn; the leader dies in the middle of it.
    let acked = Arc::new(parking_lot::Mutex::new(Vec::<(String, Instant)>::new()));
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = {
        let (acked, writing) = (acked.clone(), writing.clone());
        let addrs: Vec<String> = members.iter().map(|m| m.http.clone()).collect();
        tokio::spawn(async move {
            let clients: Vec<Client> = addrs.iter().map(|a| Client::new(std::slice::from_ref(a))).collect();
            let mut i = 0usize;
            while writing.load(std::sync::atomic::Ordering::Relaxed) && i < 5_000 {
                let id = format!("w{i}");
                // An error (no leader, the leader gone mid-write) is retried with the next id.
                if clients[i % clients.len()].register(&reg_body("web", &id, true)).await.is_ok() {
                    acked.lock().push((id, Instant::now()));
                }
                i += 1;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let killed_at = Instant::now();
    let li = members.iter().position(|m| m.id == leader).unwrap();
    members[li].server.kill9();
    let new_leader = serving_leader(&members).await;
    assert_ne!(new_leader, leader);
    // Writes continue for a while after the new leader serves.
    eventually(Duration::from_secs(20), "writes are acknowledged again after the kill", || async {
        acked.lock().iter().filter(|(_, at)| *at > killed_at).count() >= 20
    })
    .await;
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    writer.await.unwrap();
    let acked = acked.lock().clone();
    let before = acked.iter().filter(|(_, at)| *at <= killed_at).count();
    // The write gap: the longest time between two acknowledgements from the last one
    // before the kill on.
    let times: Vec<Instant> = acked.iter().map(|(_, at)| *at).skip(before.saturating_sub(1)).collect();
    let gap = times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
    eprintln!(
        "leader {leader} killed: {before} writes acknowledged before, {} after; longest gap {gap:?}; \
         node {new_leader} leads",
        acked.len() - before
    );
    assert!(before > 0, "the stream was running when the leader died");
    assert!(gap <= WRITE_GAP_MAX, "no write was acknowledged for {gap:?}");

    // Every acknowledged write is on every surviving member.
    let want: BTreeSet<String> = acked.iter().map(|(id, _)| id.clone()).collect();
    for m in members.iter().filter(|m| m.running()) {
        eventually(Duration::from_secs(10), "every acknowledged write on every survivor", || async {
            m.client().discover("default", "web", "").await.is_ok_and(|a| ids_of(&a).is_superset(&want))
        })
        .await;
    }

    // `tandem cluster status` names the dead member and fails while it is down...
    let nl_http = members.iter().find(|m| m.id == new_leader).unwrap().http.clone();
    let (ok, out) = cluster_status(&nl_http).await;
    assert!(!ok && out.contains(&format!("n{leader}")) && out.contains("unreachable"), "{out}");

    // The killed member comes back and catches up.
    members[li].server.start();
    let back = &members[li];
    eventually(Duration::from_secs(30), "the killed member holds every acknowledged write", || async {
        back.client().discover("default", "web", "").await.is_ok_and(|a| ids_of(&a).is_superset(&want))
    })
    .await;
    // ... and passes once every member answers and follows the one serving leader.
    let (ok, out) = cluster_status(&members[li].http).await;
    assert!(ok && out.contains(&format!("n{new_leader} leads and serves writes")), "{out}");
    eprintln!("{out}");

    // The new leader holds the leases: a heartbeat through a follower renews one (a
    // leader without it would answer 404), and the silent instance expires.
    let nl = members.iter().find(|m| m.id == new_leader).unwrap();
    let via = members.iter().find(|m| m.id != new_leader && m.running()).unwrap();
    via.client().heartbeat("default", "beat", "b1").await.expect("the new leader renews the lease");
    eventually(Duration::from_secs(20), "the instance that never beat expires on the new leader", || async {
        nl.client().discover("default", "silent", "").await.is_ok_and(|a| ids(&a).is_empty())
    })
    .await;
    // The beating lease never expired: the instance is there.
    beating.store(false, std::sync::atomic::Ordering::Relaxed);
    beater.await.unwrap();
    let beat = nl.client().discover("default", "beat", "").await.unwrap();
    assert_eq!(ids(&beat), vec!["b1".to_owned()], "the lease that kept beating expired: {beat}");
    let status = nl.client().status().await.unwrap();
    assert_eq!(status["cluster"]["role"], "leader", "{status}");

    // Cut off from a quorum, a member refuses consistent reads (it cannot know what it
    // misses) and keeps serving plain ones.
    let survivor = members.iter().position(|m| m.running()).unwrap();
    for m in members.iter_mut().enumerate().filter(|(i, m)| *i != survivor && m.running()).map(|(_, m)| m) {
        m.server.kill9();
    }
    let url = format!("{}/v1/services/default/web", members[survivor].http);
    let refused = reqwest::get(format!("{url}?consistent=true")).await.unwrap();
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.unwrap();
    let code = body["error"]["code"].as_str().unwrap_or_default().to_owned();
    assert!(code == "no_leader" || code == "leader_unreachable", "{body}");
    assert_eq!(reqwest::get(&url).await.unwrap().status(), 200, "plain reads go on");
}

/// `tandem cluster status --addr <addr>`: (exit status 0, standard output).
async fn cluster_status(addr: &str) -> (bool, String) {
    let addr = addr.to_owned();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(common::tandem_bin())
            .args(["cluster", "status", "--addr", &addr])
            .output()
            .expect("tandem runs");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    })
    .await
    .unwrap()
}

/// The `[replication]` table of a test node (quick backoff, small batches).
fn replication_toml(listen: u16, certs: &Path, dc: &str, peer: &str, addr: u16, addrs: &[u16]) -> String {
    let addrs: Vec<String> = addrs.iter().map(|p| format!("\"127.0.0.1:{p}\"")).collect();
    format!(
        "[replication]\nlisten = \"127.0.0.1:{listen}\"\nca_cert = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\
         backoff_initial_ms = 50\nbackoff_max_ms = 500\nping_interval_ms = 200\nbatch_events_max = 64\n\
         stale_after_ms = 1500\n\
         peers = [{{ dc = \"{peer}\", addr = \"127.0.0.1:{addr}\", addrs = [{}] }}]\n",
        certs.join("ca.pem").display(),
        certs.join(format!("{dc}.pem")).display(),
        certs.join(format!("{dc}.key")).display(),
        addrs.join(", "),
    )
}

/// The applied mark of `origin` a node's status shows, as (epoch, seq).
async fn applied_mark(c: &Client, origin: &str) -> Option<(u64, u64)> {
    let s = c.status().await.ok()?;
    let m = &s["applied"][origin];
    Some((m["epoch"].as_u64()?, m["seq"].as_u64()?))
}

/// Two DCs' certificates in `dir/certs` and dc-b, one node that knows every node of dc-a,
/// started; dc-a's replication ports (one per member, for `start_members`) and dc-b's.
fn start_dc_b(dir: &Path) -> (Member, Vec<u16>, u16) {
    let certs = dir.join("certs");
    tandem_replicator::tls::generate_dev_pki(&certs, &[DC, "dc-b"], false).unwrap();
    let a_repl: Vec<u16> = (0..NODES).map(|_| free_udp_port()).collect();
    let (b_repl, b_http) = (free_udp_port(), free_tcp_port());
    let b_cfg = dir.join("b.toml");
    std::fs::write(
        &b_cfg,
        format!(
            "dc = \"dc-b\"\ndata_dir = \"{}\"\nhttp_addr = \"127.0.0.1:{b_http}\"\n{}",
            dir.join("b").display(),
            replication_toml(b_repl, &certs, "dc-b", DC, a_repl[0], &a_repl[1..]),
        ),
    )
    .unwrap();
    let mut b =
        Member { id: 0, http: format!("http://127.0.0.1:{b_http}"), server: ServerProc::new(b_cfg, "info") };
    b.server.start();
    (b, a_repl, b_repl)
}

/// dc-b (`start_dc_b`) and dc-a, a group of three replicating with it, started.
fn start_two_dcs(dir: &Path) -> (Member, Vec<Member>) {
    let certs = dir.join("certs");
    let (b, a_repl, b_repl) = start_dc_b(dir);
    let members = start_members(dir, &|i| replication_toml(a_repl[i], &certs, DC, "dc-b", b_repl, &[]));
    (b, members)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dc_group_replicates_through_its_leader_and_a_new_leader_resumes_without_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let (b, mut members) = start_two_dcs(dir.path());
    let leader = serving_leader(&members).await;

    // Both ways: dc-a's writes reach dc-b, and dc-b's reach every node of dc-a (dc-b
    // finds dc-a's leader among its addresses).
    let follower = members.iter().find(|m| m.id != leader).unwrap();
    follower.client().register(&reg_body("web", "a0", true)).await.unwrap();
    b.client().register(&reg_body("web", "b0", true)).await.unwrap();
    let both: BTreeSet<String> = ["a0".to_owned(), "b0".to_owned()].into();
    for m in members.iter().chain([&b]) {
        eventually(Duration::from_secs(30), "each DC holds both DCs' writes", || async {
            m.client().discover("default", "web", "dc=all").await.is_ok_and(|a| ids_of(&a).is_superset(&both))
        })
        .await;
    }

    // Writes on dc-a while its leader dies.
    let mut acked = BTreeSet::new();
    let clients: Vec<Client> = members.iter().map(|m| m.client()).collect();
    let li = members.iter().position(|m| m.id == leader).unwrap();
    for i in 0..400usize {
        if i == 150 {
            members[li].server.kill9();
        }
        let id = format!("a{}", i + 1);
        if clients[i % clients.len()].register(&reg_body("web", &id, true)).await.is_ok() {
            acked.insert(id);
        }
    }
    let new_leader = serving_leader(&members).await;
    assert_ne!(new_leader, leader);
    for i in 400..420usize {
        let id = format!("a{}", i + 1);
        let nl = members.iter().find(|m| m.id == new_leader).unwrap();
        nl.client().register(&reg_body("web", &id, true)).await.expect("the new leader takes writes");
        acked.insert(id);
    }
    // dc-b holds every acknowledged write of dc-a, and its mark of dc-a is dc-a's own
    // last seq: no gap, nothing missing, nothing extra.
    eventually(Duration::from_secs(30), "dc-b holds every acknowledged write of dc-a", || async {
        b.client().discover("default", "web", "dc=dc-a").await.is_ok_and(|a| ids_of(&a).is_superset(&acked))
    })
    .await;
    let nl = members.iter().find(|m| m.id == new_leader).unwrap();
    let own = nl.client().status().await.unwrap()["log"].clone();
    let own = (own["epoch"].as_u64().unwrap(), own["last_seq"].as_u64().unwrap());
    eventually(Duration::from_secs(30), "dc-b's mark of dc-a reaches dc-a's own", || async {
        applied_mark(&b.client(), DC).await == Some(own)
    })
    .await;
    // dc-b's copies read on every node of dc-a are fresh, followers included (a follower
    // runs no gateway: the leader tells it which origins are stale), well past
    // stale_after_ms since the start.
    for m in members.iter().filter(|m| m.running()) {
        eventually(Duration::from_secs(10), "dc-b's copies are fresh on every member", || async {
            let a = m.client().discover("default", "web", "dc=dc-b").await;
            a.is_ok_and(|a| a["instances"].as_array().is_some_and(|i| i.len() == 1 && i[0]["stale"] == false))
        })
        .await;
    }
    // A follower's status shows the leader's gateway links and self-preservation (asked
    // at the read), not its own idle ones.
    for m in members.iter().filter(|m| m.running() && m.id != new_leader) {
        let st = m.client().status().await.unwrap();
        assert_eq!(st["from_leader"]["leader"], new_leader, "{st}");
        assert_eq!(st["peers"]["dc-b"]["inbound"]["stale"], false, "{st}");
        assert!(st["self_preservation"]["namespaces"].is_object(), "{st}");
    }
    let leader_status = nl.client().status().await.unwrap();
    assert!(leader_status.get("from_leader").is_none(), "the leader answers for itself: {leader_status}");
    let held = b.client().discover("default", "web", "dc=dc-a").await.unwrap();
    eprintln!(
        "dc-a leader {leader} killed; {} writes acknowledged; dc-b holds {} of dc-a at {own:?}",
        acked.len(),
        ids(&held).len()
    );
}

/// `tandem cluster transfer-leader --to N --addr <a follower>` (with its exit status and
/// standard output and error).
async fn transfer_leader(addr: &str, to: u64) -> (bool, String) {
    tandem_cluster(&["transfer-leader", "--to", &to.to_string(), "--addr", addr]).await
}

/// `tandem cluster <args>`: (exit status 0, standard output and error).
async fn tandem_cluster(args: &[&str]) -> (bool, String) {
    tandem([&["cluster"], args].concat()).await
}

/// `tandem <args>`: (exit status 0, standard output and error).
async fn tandem(args: Vec<&str>) -> (bool, String) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(common::tandem_bin()).args(&args).output().expect("tandem runs");
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    })
    .await
    .unwrap()
}

/// Single heartbeats a follower receives at once go to the leader several to a request,
/// each with its own answer; then the lead is handed to a follower on an operator's word
/// and back, with no acknowledged write lost and the leases kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_batches_heartbeats_and_the_lead_moves_on_an_operators_word() {
    let dir = tempfile::tempdir().unwrap();
    let members = start_dc(dir.path());
    let leader = serving_leader(&members).await;
    let follower = members.iter().position(|m| m.id != leader).unwrap();
    let c = members[follower].client();
    const LEASES: usize = 120;
    for i in 0..LEASES {
        c.register(&reg_body("hb", &format!("h{i}"), false)).await.unwrap();
    }

    // Every lease renewed at once through the follower, and a few unknown ones among them.
    let http = reqwest::Client::new();
    let beats = (0..LEASES + 8).map(|i| {
        let (http, base) = (http.clone(), members[follower].http.clone());
        let id = if i < LEASES { format!("h{i}") } else { format!("nobody-{i}") };
        async move {
            let r = http.put(format!("{base}/v1/heartbeat/default/hb/{id}")).send().await.unwrap();
            (id, r.status().as_u16())
        }
    });
    let answers = futures::future::join_all(beats).await;
    for (id, status) in &answers {
        let want = if id.starts_with("nobody") { 404 } else { 200 };
        assert_eq!(*status, want, "heartbeat of {id}: {answers:?}");
    }
    let metrics =
        reqwest::get(format!("{}/metrics", members[follower].http)).await.unwrap().text().await.unwrap();
    let requests = metric_sum(&metrics, "tandem_cluster_heartbeat_forwards_total", &[]);
    let forwarded = metric_sum(&metrics, "tandem_cluster_heartbeats_forwarded_total", &[]);
    assert_eq!(forwarded as usize, LEASES + 8, "{metrics}");
    assert!(requests < forwarded, "{forwarded} heartbeats went in {requests} requests: not batched");

    // The leases keep beating (in batches, at the follower) through what follows.
    let beating = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let beater = {
        let (beating, c) = (beating.clone(), members[follower].client());
        let batch = serde_json::json!({
            "instances": (0..LEASES).map(|i| serde_json::json!({"service": "hb", "instance_id": format!("h{i}")})).collect::<Vec<_>>()
        });
        tokio::spawn(async move {
            while beating.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = c.heartbeat_batch(&batch).await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };

    // An unknown member, and a transfer through a follower to the other follower.
    let (ok, said) = transfer_leader(&members[follower].http, 9).await;
    assert!(!ok && said.contains("not a voting member"), "{said}");
    let target = members.iter().find(|m| m.id != leader && m.id != members[follower].id).unwrap().id;
    let (ok, said) = transfer_leader(&members[follower].http, target).await;
    assert!(ok, "transfer to n{target}: {said}");
    assert!(said.contains(&format!("n{target} serves writes")), "{said}");
    assert_eq!(serving_leader(&members).await, target);
    // And back to the first leader, asked at the new one.
    let at = &members.iter().find(|m| m.id == target).unwrap().http;
    let (ok, said) = transfer_leader(at, leader).await;
    assert!(ok, "transfer back to n{leader}: {said}");
    assert_eq!(serving_leader(&members).await, leader);

    // Nothing lost, every lease kept (the transfers are two take-overs, each restarting the
    // leases from their published health).
    c.register(&reg_body("hb", "after", true)).await.expect("writes go on after the transfers");
    for m in &members {
        eventually(Duration::from_secs(10), "every member holds every lease, healthy", || async {
            m.client().discover("default", "hb", "").await.is_ok_and(|a| {
                let ids = ids_of(&a);
                (0..LEASES).all(|i| ids.contains(&format!("h{i}"))) && ids.contains("after")
            })
        })
        .await;
    }
    beating.store(false, std::sync::atomic::Ordering::Relaxed);
    beater.await.unwrap();

    // A follower reloaded with another failover policy than its leader's refuses discovery
    // (its answers would differ from the rest of its DC) until its file agrees again.
    let odd = &members[follower];
    let file = dir.path().join(format!("n{}.toml", odd.id));
    let original = std::fs::read_to_string(&file).unwrap();
    let reload = |m: &Member| {
        let url = format!("{}/v1/admin/reload", m.http);
        async move {
            reqwest::Client::new().post(url).header("x-tandem-admin", "1").send().await.unwrap().status()
        }
    };
    std::fs::write(&file, original.replace("[cluster]", "[failover]\nmode = \"global\"\n[cluster]")).unwrap();
    assert_eq!(reload(odd).await, 200);
    eventually(Duration::from_secs(10), "the odd follower refuses discovery", || async {
        let r = reqwest::get(format!("{}/v1/services/default/hb", odd.http)).await.unwrap();
        r.status() == 503 && r.text().await.unwrap().contains("policy_mismatch")
    })
    .await;
    let (ok, said) = cluster_status(&odd.http).await;
    assert!(!ok && said.contains("differ between members"), "{said}");
    for m in members.iter().filter(|m| m.id != odd.id) {
        assert!(m.client().discover("default", "hb", "").await.is_ok(), "n{} answers", m.id);
    }
    std::fs::write(&file, &original).unwrap();
    assert_eq!(reload(odd).await, 200);
    eventually(Duration::from_secs(10), "the follower answers again once its file agrees", || async {
        odd.client().discover("default", "hb", "").await.is_ok()
    })
    .await;
    let (ok, said) = cluster_status(&odd.http).await;
    assert!(ok, "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_back_from_a_disk_loss_votes_only_once_it_holds_the_groups_log() {
    // A member whose disk was wiped forgot what it acknowledged. Had it voted at once,
    // with the leader down it would elect the last member whatever that one lacks (and
    // it would form a group of its own from its member list). It asks the others how far
    // their logs reach, holds its votes until its own log does, and follows the leader.
    let dir = tempfile::tempdir().unwrap();
    let (mut members, leader) = dc_with_ten_writes(dir.path()).await;
    let lost = members.iter().position(|m| m.id != leader).unwrap();
    let survivor = members.iter().position(|m| m.id != leader && m.id != members[lost].id).unwrap();
    eventually(Duration::from_secs(10), "every member holds the writes", || async {
        let mut all = true;
        for m in &members {
            all &= m.client().discover("default", "web", "").await.is_ok_and(|a| ids_of(&a).len() == 10);
        }
        all
    })
    .await;
    members[lost].server.kill9();
    std::fs::remove_dir_all(dir.path().join(format!("n{}", members[lost].id))).unwrap();
    members[(leader - 1) as usize].server.kill9();
    members[lost].server.start();
    eventually(Duration::from_secs(15), "the empty member answers, holding its votes", || async {
        group_status(&members[lost]).await.is_some_and(|s| s["votes_held_until"].as_u64() > Some(0))
    })
    .await;
    // Several election timeouts: the survivor campaigns, the empty member does not vote.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for k in [lost, survivor] {
        let s = group_status(&members[k]).await.expect("answers");
        assert_ne!(
            s["serving_writes"], true,
            "n{} serves writes with the empty member's vote: {s}",
            members[k].id
        );
    }
    // The old leader is back: a leader is elected without the empty member, which catches
    // up and votes again.
    members[(leader - 1) as usize].server.start();
    serving_leader(&members).await;
    eventually(Duration::from_secs(20), "the empty member caught up and votes again", || async {
        let s = group_status(&members[lost]).await;
        let read = members[lost].client().discover("default", "web", "").await;
        s.is_some_and(|s| s["votes_held_until"].is_null()) && read.is_ok_and(|a| ids_of(&a).len() == 10)
    })
    .await;
    let (sound, table) = cluster_status(&members[survivor].http).await;
    assert!(sound, "{table}");
}

/// A node that joins the DC of `start_members` under id `id`, on addresses `at` (Raft,
/// HTTP) or new ones: its certificate, a config like member 1's with itself added to
/// `members` and `join = true`, started. Returns the member and its Raft and HTTP
/// addresses.
fn start_joiner(dir: &Path, id: u64, at: Option<(String, String)>) -> (Member, String, String) {
    let certs = dir.join("certs");
    let paths =
        tandem_replicator::tls::generate_dev_node_certs(&certs, DC, &[id], false).unwrap()[0].1.clone();
    let (raft, http) = at.unwrap_or_else(|| {
        (format!("127.0.0.1:{}", free_udp_port()), format!("127.0.0.1:{}", free_tcp_port()))
    });
    let first = std::fs::read_to_string(dir.join("n1.toml")).unwrap();
    let mut body = String::new();
    for line in first.lines() {
        let key = line.split(" = ").next().unwrap_or("");
        let line = match key {
            "data_dir" => format!("data_dir = \"{}\"", dir.join(format!("n{id}")).display()),
            "http_addr" => format!("http_addr = \"{http}\""),
            "node_id" => format!("node_id = {id}"),
            // Itself added; a member it takes the place of (on its addresses) left out.
            "members" => {
                let others: Vec<&str> = line
                    .trim_start_matches("members = [")
                    .split("}, ")
                    .filter(|m| !m.contains(&format!("\"{raft}\"")))
                    .collect();
                let me = format!("{{ id = {id}, raft_addr = \"{raft}\", http_addr = \"{http}\" }}, ");
                format!("members = [{me}{}", others.join("}, "))
            }
            "cert" => format!("cert = \"{}\"", paths.cert.display()),
            "key" => format!("key = \"{}\"", paths.key.display()),
            _ => line.to_owned(),
        };
        body.push_str(&line);
        body.push('\n');
    }
    body.push_str("join = true\n");
    let config = dir.join(format!("n{id}.toml"));
    std::fs::write(&config, body).unwrap();
    let mut m = Member { id, http: format!("http://{http}"), server: ServerProc::new(config, "info") };
    m.server.start();
    (m, raft, http)
}

/// The voters a member's status lists.
async fn voters(m: &Member) -> Option<BTreeSet<u64>> {
    let s = group_status(m).await?;
    Some(
        s["members"]
            .as_array()?
            .iter()
            .filter(|v| v["voter"] == true)
            .filter_map(|v| v["id"].as_u64())
            .collect(),
    )
}

/// Membership through `tandem cluster`: a node started to join is added (a learner sent
/// the group's state, then a voter), a member removed, a dead one replaced, all while the
/// group serves; a removal that would leave no quorum that answers, and removing the
/// leader, are refused with nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_added_removed_and_replaced_and_a_change_that_loses_quorum_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut members, leader) = dc_with_ten_writes(dir.path()).await;
    let followers: Vec<usize> = (0..members.len()).filter(|k| members[*k].id != leader).collect();
    let (gone, dead) = (followers[0], followers[1]);

    // Add node 4, asked through a follower (forwarded to the leader).
    let (n4, raft4, http4) = start_joiner(dir.path(), 4, None);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(group_status(&n4).await.map(|s| s["leader"].clone()), Some(Value::Null), "it formed no group");
    let (ok, out) = tandem_cluster(&[
        "add",
        "--id",
        "4",
        "--raft-addr",
        &raft4,
        "--http-addr",
        &http4,
        "--addr",
        &members[gone].http,
    ])
    .await;
    assert!(ok, "{out}");
    assert!(out.contains("voters [1,2,3,4]"), "{out}");
    members.push(n4);
    eventually(Duration::from_secs(10), "node 4 holds the writes and the membership", || async {
        let read = members[3].client().discover("default", "web", "").await;
        read.is_ok_and(|a| ids_of(&a).len() == 10)
            && voters(&members[3]).await == Some(BTreeSet::from([1, 2, 3, 4]))
    })
    .await;
    let (sound, table) = cluster_status(&members[0].http).await;
    assert!(sound && table.contains(&http4), "{table}");

    // The leader is not removed; a follower is.
    let (ok, out) =
        tandem_cluster(&["remove", "--id", &leader.to_string(), "--addr", &members[0].http]).await;
    assert!(!ok && out.contains("membership_refused"), "{out}");
    let gone_id = members[gone].id;
    let (ok, out) =
        tandem_cluster(&["remove", "--id", &gone_id.to_string(), "--addr", &members[0].http]).await;
    assert!(ok, "{out}");
    members[gone].server.kill9();
    let live: BTreeSet<u64> = members.iter().filter(|m| m.id != gone_id).map(|m| m.id).collect();
    assert_eq!(voters(&members[(leader - 1) as usize]).await, Some(live.clone()));

    // One of the three left dies: removing another would leave one of two answering.
    members[dead].server.kill9();
    let (ok, out) =
        tandem_cluster(&["remove", "--id", "4", "--addr", &members[(leader - 1) as usize].http]).await;
    assert!(!ok && out.contains("would_lose_quorum"), "{out}");
    assert_eq!(voters(&members[(leader - 1) as usize]).await, Some(live), "nothing changed");

    // The dead member is replaced by node 5 on its machine (its addresses; its disk gone):
    // the group is whole again and serves.
    let dead_id = members[dead].id;
    let listed = group_status(&members[(leader - 1) as usize]).await.unwrap();
    let dead_raft = listed["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"].as_u64() == Some(dead_id))
        .map(|m| m["raft_addr"].as_str().unwrap().to_owned())
        .unwrap();
    let dead_http = members[dead].http.trim_start_matches("http://").to_owned();
    let (n5, raft5, http5) = start_joiner(dir.path(), 5, Some((dead_raft, dead_http)));
    let (ok, out) = tandem_cluster(&[
        "replace",
        "--old",
        &dead_id.to_string(),
        "--id",
        "5",
        "--raft-addr",
        &raft5,
        "--http-addr",
        &http5,
        "--addr",
        &members[(leader - 1) as usize].http,
    ])
    .await;
    assert!(ok, "{out}");
    members.push(n5);
    let want = BTreeSet::from([leader, 4, 5]);
    eventually(Duration::from_secs(10), "node 5 holds the writes and the membership", || async {
        let read = members[4].client().discover("default", "web", "").await;
        read.is_ok_and(|a| ids_of(&a).len() == 10) && voters(&members[4]).await == Some(want.clone())
    })
    .await;
    members[4].client().register(&reg_body("web", "w-after", true)).await.unwrap();
    let (sound, table) = cluster_status(&members[3].http).await;
    assert!(sound, "{table}");
    assert!(!table.lines().any(|l| l.starts_with(&format!("n{dead_id} "))), "{table}");
}
