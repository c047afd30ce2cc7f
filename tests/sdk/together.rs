//! A process's instances registered together (`Provider::register_all`), and registered
//! again together when the registry lost them.

use std::time::Duration;

use tandem::config::Config;
use tandem::node::Node;
use tandem_client::api::REGISTER_BATCH_MAX;
use tandem_client::sdk::{InstanceSpec, Provider};

use super::common::*;
use super::{fixed_port_config, metric, sdk_config, url};

/// The registry loses its data: `node` stops, and a node on an empty dir (returned with
/// it) starts at the same address.
async fn lose_data(node: Node, node_cfg: &Config) -> (Node, tempfile::TempDir) {
    node.shutdown().await;
    let empty = tempfile::tempdir().unwrap();
    let mut fresh_cfg = single_config(empty.path(), "dc-a");
    fresh_cfg.http_addr = node_cfg.http_addr;
    (Node::start(fresh_cfg, None).await.unwrap(), empty)
}

/// A process with many instances: `register_all` registers them in batched requests (one
/// durable write each), and when the registry has lost them all, the heartbeat batcher
/// registers them again together, not one request per instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_registers_its_instances_together_and_again_together_once_the_registry_lost_them() {
    let dir = tempfile::tempdir().unwrap();
    let node_cfg = fixed_port_config(dir.path());
    let node = Node::start(node_cfg.clone(), None).await.unwrap();
    let addrs = [url(&node)];
    // More than one request may carry: two requests.
    let count = REGISTER_BATCH_MAX + 44;
    let ttl = Duration::from_millis(2_400);
    let mut specs: Vec<InstanceSpec> = (0..count)
        .map(|i| InstanceSpec::new("herd", "10.0.0.1", 1 + i as u16).instance_id(format!("h-{i}")).ttl(ttl))
        .collect();
    specs[7] = InstanceSpec::new("herd", "10.0.0.2", 7).ttl(ttl);
    specs.push(InstanceSpec::new("herd-p", "10.0.0.3", 3).instance_id("p-1").persistent());
    let batches0 = metric(&node, "tandem_registration_batches_total").await;
    let regs0 = metric(&node, "tandem_registrations_total").await;
    let providers = Provider::register_all(sdk_config(&addrs), specs).await.unwrap();
    assert_eq!(providers.len(), count + 1);
    assert_eq!(metric(&node, "tandem_registration_batches_total").await - batches0, 2);
    assert_eq!(metric(&node, "tandem_registrations_total").await - regs0, count as u64 + 1);
    // In the order of the specs, a generated id where none was given.
    assert_eq!(providers[3].instance_id(), "h-3");
    let generated = providers[7].instance_id();
    assert!(generated.starts_with("herd#10.0.0.2:7#"), "{generated}");
    assert_eq!(providers[count].state().lease_ttl, Duration::ZERO, "persistent");
    let c = client(&node);
    assert_eq!(ids(&c.discover("default", "herd", "dc=all").await.unwrap()).len(), count);
    assert_eq!(ids(&c.discover("default", "herd-p", "").await.unwrap()), ["p-1"]);
    let leased = &providers[..count];
    eventually(Duration::from_secs(5), "every leased instance renewed", || async move {
        leased.iter().all(|p| p.state().heartbeats_ok >= 1)
    })
    .await;

    let (fresh, _empty) = lose_data(node, &node_cfg).await;
    eventually(Duration::from_secs(10), "every leased instance registered again", || async move {
        leased.iter().all(|p| p.state().reregistrations >= 1)
    })
    .await;
    let c = client(&fresh);
    let back = ids(&c.discover("default", "herd", "dc=all").await.unwrap());
    assert_eq!(back.len(), count, "{back:?}");
    assert!(back.contains(&"h-3".to_owned()) && !back.contains(&generated), "a generated id is not reused");
    let batches = metric(&fresh, "tandem_registration_batches_total").await;
    let regs = metric(&fresh, "tandem_registrations_total").await;
    // Rounds after the outage may take the instances in a few sets; one request each would
    // make it `count` single registrations and no batch.
    assert!(
        batches >= 2 && batches <= count as u64 / 10 && regs >= count as u64,
        "{regs} registrations again in {batches} batched requests"
    );
    drop(providers);
    fresh.shutdown().await;
}

/// `register_all` registers everything or nothing: specs it can tell are wrong fail before
/// a request, and a chunk the registry refuses undoes the chunks before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registering_together_is_all_or_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut node_cfg = single_config(dir.path(), "dc-a");
    node_cfg.limits.namespace_instances_max = 300;
    let node = Node::start(node_cfg, None).await.unwrap();
    let mut cfg = sdk_config(&[url(&node)]);
    cfg.provider.register_attempts_max = 1;
    let spec = |i: usize| InstanceSpec::new("all", "10.0.0.1", 1).instance_id(format!("a-{i}"));

    let e = Provider::register_all(cfg.clone(), vec![spec(0), InstanceSpec::new("bad name", "10.0.0.1", 1)])
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("specs[1]") && !e.is_retryable(), "{e}");
    let e = Provider::register_all(cfg.clone(), vec![spec(0), spec(1), spec(0)]).await.err().unwrap();
    assert!(e.to_string().contains("specs[2]") && e.to_string().contains("specs[0]"), "{e}");
    assert_eq!(metric(&node, "tandem_registration_batches_total").await, 0, "nothing was sent");

    // 400 in two chunks: the second breaks the namespace's quota of 300.
    let e = Provider::register_all(cfg.clone(), (0..400).map(spec).collect()).await.err().unwrap();
    assert!(e.to_string().contains("quota"), "{e}");
    assert_eq!(metric(&node, "tandem_registration_batches_total").await, 2);
    let c = client(&node);
    assert!(ids(&c.discover("default", "all", "dc=all").await.unwrap()).is_empty(), "the first chunk undone");

    // Within the quota, the same call registers them all.
    let ps = Provider::register_all(cfg, (0..250).map(spec).collect()).await.unwrap();
    assert_eq!(ids(&c.discover("default", "all", "dc=all").await.unwrap()).len(), 250);
    drop(ps);
    node.shutdown().await;
}

/// A beat that went out while its instance was being registered again answers "unknown"
/// about a registration already made: the instance is not registered once more for it.
/// Beats every 10 ms against a registration again of eight chunks, which takes longer than
/// that, make such answers common.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_is_registered_again_once_however_many_beats_found_it_unknown_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let node_cfg = fixed_port_config(dir.path());
    let node = Node::start(node_cfg.clone(), None).await.unwrap();
    let mut cfg = sdk_config(&[url(&node)]);
    cfg.provider.heartbeat_interval = Some(Duration::from_millis(10));
    // Eight chunks: the last ones are registered again well after the next beat.
    let count = 8 * REGISTER_BATCH_MAX;
    let specs = (0..count).map(|i| {
        InstanceSpec::new("quick", "10.0.0.1", 1).instance_id(format!("q-{i}")).ttl(Duration::from_secs(60))
    });
    let providers = Provider::register_all(cfg, specs.collect()).await.unwrap();
    let (fresh, _empty) = lose_data(node, &node_cfg).await;
    let ps = &providers;
    eventually(Duration::from_secs(10), "every instance registered again", || async move {
        ps.iter().all(|p| p.state().reregistrations >= 1)
    })
    .await;
    // Thirty periods more for any registration once more to land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let regs = metric(&fresh, "tandem_registrations_total").await;
    let twice = providers.iter().filter(|p| p.state().reregistrations > 1).count();
    assert_eq!(
        (regs, twice),
        (count as u64, 0),
        "registrations written, instances registered again twice or more"
    );
    drop(providers);
    fresh.shutdown().await;
}
