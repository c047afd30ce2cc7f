//! `tandem cluster status`: every member of a DC's group as its own `/v1/status` shows it,
//! in one table, and whether they agree on a leader that serves writes (and on their
//! `[failover]`/`[protection]` digest). `tandem cluster
//! transfer-leader`: hand the lead to another member and wait until it serves writes.

use serde_json::Value;
use tandem_client::{Client, ClientError};

/// How far behind the leader's last log entry a member may be and count as caught up
/// (entries: a few are in flight under load; a member back from a restart or a disk loss
/// is thousands behind, or has no matched index yet): as a new member must be before it
/// is promoted to a voter.
pub use crate::node::group::CAUGHT_UP_ENTRIES_MAX;

/// One member's row.
struct Row {
    id: u64,
    http: String,
    status: Result<Value, String>,
}

/// The base URL of a member's `http_addr`, with the scheme the operator used.
fn member_url(scheme: &str, http_addr: &str) -> String {
    format!("{scheme}://{http_addr}")
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Prints the group and returns whether it is sound: every member answers, they agree on
/// one leader, and it serves writes. `client_for(url)` makes a client like the one the
/// operator's flags make, for one member.
pub async fn status(
    first: &Client,
    scheme: &str,
    client_for: &dyn Fn(&str) -> Client,
) -> Result<bool, ClientError> {
    let asked = first.status().await?;
    let dc = cell(&asked["dc"]);
    let Some(members) = asked["cluster"]["members"].as_array().cloned() else {
        println!("DC {dc}: a single node (no [cluster] in its config)");
        return Ok(true);
    };
    let mut rows = Vec::new();
    for m in &members {
        let id = m["id"].as_u64().unwrap_or(0);
        let http = cell(&m["http_addr"]);
        let status = client_for(&member_url(scheme, &http)).status().await.map_err(|e| e.to_string());
        rows.push(Row { id, http, status });
    }
    let leaders: std::collections::BTreeSet<String> =
        rows.iter().filter_map(|r| r.status.as_ref().ok()).map(|s| cell(&s["cluster"]["leader"])).collect();
    let serving: Vec<u64> = rows
        .iter()
        .filter(|r| r.status.as_ref().is_ok_and(|s| s["cluster"]["serving_writes"] == true))
        .map(|r| r.id)
        .collect();
    // The leader's own answer knows each member's matched index (one moment's view).
    let leader_view = rows
        .iter()
        .filter_map(|r| r.status.as_ref().ok())
        .find(|s| s["cluster"]["serving_writes"] == true)
        .map(|s| &s["cluster"]);
    let matched_of = |id: u64| -> Option<u64> {
        leader_view?["members"].as_array()?.iter().find(|m| m["id"].as_u64() == Some(id))?["matched_index"]
            .as_u64()
    };
    let matched = |id: u64| matched_of(id).map_or("-".into(), |m| m.to_string());
    // Entries each member is behind the leader's log (None: not known).
    let behind = |id: u64| -> Option<u64> {
        let last = leader_view?["last_log_index"].as_u64()?;
        if leader_view?["node_id"].as_u64() == Some(id) {
            return Some(0);
        }
        Some(last.saturating_sub(matched_of(id)?))
    };
    println!(
        "DC {dc}: {} members; {}",
        rows.len(),
        match (serving.as_slice(), leaders.len()) {
            ([one], 1) => format!("n{one} leads and serves writes"),
            ([], _) => "no member serves writes (no leader, or one not yet taken over)".into(),
            _ => format!(
                "members disagree on the leader: {}",
                leaders.into_iter().collect::<Vec<_>>().join(", ")
            ),
        }
    );
    println!(
        "{:<6} {:<10} {:<8} {:>6} {:>7} {:>10} {:>10} {:>10} {:>7}  http",
        "node", "role", "serving", "term", "leader", "applied", "last_log", "matched", "behind"
    );
    for r in &rows {
        match &r.status {
            Ok(s) => {
                let c = &s["cluster"];
                println!(
                    "{:<6} {:<10} {:<8} {:>6} {:>7} {:>10} {:>10} {:>10} {:>7}  {}",
                    format!("n{}", r.id),
                    cell(&c["role"]),
                    if c["serving_writes"] == true { "yes" } else { "-" },
                    cell(&c["term"]),
                    cell(&c["leader"]),
                    cell(&c["applied_index"]),
                    cell(&c["last_log_index"]),
                    matched(r.id),
                    behind(r.id).map_or("-".into(), |b| b.to_string()),
                    r.http
                );
            }
            Err(e) => println!("{:<6} unreachable: {e}  {}", format!("n{}", r.id), r.http),
        }
    }
    // Every member must answer discovery from the same [failover]/[protection].
    let digests: std::collections::BTreeMap<String, Vec<u64>> = rows
        .iter()
        .filter_map(|r| r.status.as_ref().ok().map(|s| (r.id, s)))
        .fold(Default::default(), |mut m, (id, s)| {
            m.entry(cell(&s["cluster"]["policy_digest"])).or_default().push(id);
            m
        });
    let policies_agree = digests.len() <= 1;
    if !policies_agree {
        let each: Vec<String> = digests
            .iter()
            .map(|(d, ids)| {
                format!("{d} on {}", ids.iter().map(|i| format!("n{i}")).collect::<Vec<_>>().join(", "))
            })
            .collect();
        println!(
            "[failover]/[protection] differ between members ({}): followers unlike the leader refuse discovery \
             (policy_mismatch); reload the same file on every member",
            each.join("; ")
        );
    }
    let all_up = rows.iter().all(|r| r.status.is_ok());
    let lagging: Vec<String> = rows
        .iter()
        .filter(|r| behind(r.id).is_none_or(|b| b > CAUGHT_UP_ENTRIES_MAX))
        .map(|r| format!("n{}", r.id))
        .collect();
    if !lagging.is_empty() && serving.len() == 1 {
        println!(
            "not caught up (more than {CAUGHT_UP_ENTRIES_MAX} entries behind the leader's log, or not known): {}",
            lagging.join(", ")
        );
    }
    Ok(all_up
        && lagging.is_empty()
        && policies_agree
        && serving.len() == 1
        && rows
            .iter()
            .filter_map(|r| r.status.as_ref().ok())
            .all(|s| s["cluster"]["leader"].as_u64() == serving.first().copied()))
}

/// How long `transfer-leader` waits for the new leader to serve writes once it leads.
const SERVING_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Asks the group (through `first`, any member) to hand the lead to member `to`, then
/// waits until `to` serves writes (asked at its own address, from the member list), and
/// says how long each part took.
pub async fn transfer_leader(
    first: &Client,
    to: u64,
    scheme: &str,
    client_for: &dyn Fn(&str) -> Client,
) -> Result<(), ClientError> {
    let started = std::time::Instant::now();
    let done = first.transfer_leader(to).await?;
    println!(
        "n{} leads in term {} ({} ms after the leader was asked)",
        cell(&done["leader"]),
        cell(&done["term"]),
        cell(&done["took_ms"])
    );
    let asked = first.status().await?;
    let target = asked["cluster"]["members"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["id"].as_u64() == Some(to)))
        .map(|m| client_for(&member_url(scheme, &cell(&m["http_addr"]))))
        .ok_or_else(|| ClientError::Decode(format!("n{to} is not in the member list")))?;
    // The new leader serves writes once it took over (a read-index round, the leases).
    loop {
        if target.status().await.is_ok_and(|s| s["cluster"]["serving_writes"] == true) {
            println!("n{to} serves writes ({} ms in all)", started.elapsed().as_millis());
            return Ok(());
        }
        if started.elapsed() > SERVING_WAIT {
            return Err(ClientError::Unreachable(format!(
                "n{to} leads but did not serve writes within {SERVING_WAIT:?} (see tandem cluster status)"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Prints a membership change's outcome: the voters and learners after it.
pub fn changed(answer: Result<Value, ClientError>) -> Result<(), ClientError> {
    let done = answer?;
    println!(
        "voters {}, learners {} ({} ms)",
        cell(&done["voters"]),
        cell(&done["learners"]),
        cell(&done["took_ms"])
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_and_urls_read_plainly() {
        assert_eq!(cell(&Value::Null), "-");
        assert_eq!(cell(&Value::String("leader".into())), "leader");
        assert_eq!(cell(&serde_json::json!(42)), "42");
        assert_eq!(member_url("https", "10.0.0.2:8500"), "https://10.0.0.2:8500");
    }
}
