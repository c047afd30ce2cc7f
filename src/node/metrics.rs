//! `GET /metrics`: the node's counters, gauges and histograms in the Prometheus text format.

use std::sync::atomic::Ordering;

use super::prom::Metrics;
use crate::shared::NodeShared;

mod store;

impl NodeShared {
    /// GET /metrics, Prometheus text format.
    pub fn render_metrics(&self) -> String {
        let reg = &self.registry;
        let c = &reg.counters;
        let mut m = Metrics::default();
        let dc: &str = &reg.dc;
        m.counter(
            "tandem_heartbeats_total",
            "Heartbeats accepted",
            &[("dc", dc)],
            c.heartbeats.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_heartbeats_unknown_total",
            "Heartbeats for unknown or foreign instances",
            &[("dc", dc)],
            c.heartbeats_unknown.load(Ordering::Relaxed),
        );
        self.render_store(&mut m, dc);
        m.counter(
            "tandem_invalid_records_total",
            "Reads that met a stored record or own event breaking the schema's rules (skipped)",
            &[("dc", dc)],
            self.invalid_records.count(),
        );
        m.counter(
            "tandem_registrations_total",
            "Registrations accepted",
            &[("dc", dc)],
            c.registrations.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_deregistrations_total",
            "Explicit deregistrations",
            &[("dc", dc)],
            c.deregistrations.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_lease_expirations_total",
            "Leases expired",
            &[("dc", dc)],
            c.expirations.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_health_events_total",
            "Health change events minted",
            &[("dc", dc)],
            c.health_events.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_events_applied_total",
            "State changes applied",
            &[("dc", dc), ("origin", "local")],
            c.events_local.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_events_applied_total",
            "State changes applied",
            &[("dc", dc), ("origin", "remote")],
            c.events_remote.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_discover_requests_total",
            "Discovery requests",
            &[("dc", dc)],
            c.discover_requests.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_heartbeat_batches_total",
            "POST /v1/heartbeats requests (their entries count in tandem_heartbeats_total)",
            &[("dc", dc)],
            c.heartbeat_batches.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_registration_batches_total",
            "POST /v1/registrations requests (their written entries count in tandem_registrations_total)",
            &[("dc", dc)],
            c.register_batches.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_watch_wakeups_total",
            "Watch answers sent after a change (blocking queries and streams)",
            &[("dc", dc)],
            c.watch_wakeups.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_stale_flips_at_read_total",
            "Discovery reads that found a remote origin turned stale or fresh since the answer was kept, and moved the service's index",
            &[("dc", dc)],
            c.stale_flips_at_read.load(Ordering::Relaxed),
        );
        m.gauge(
            "tandem_watch_streams",
            "Streaming watches open now",
            &[("dc", dc)],
            self.http.streams.open.load(Ordering::Relaxed) as f64,
        );
        m.gauge(
            "tandem_blocking_queries",
            "Blocking queries waiting now",
            &[("dc", dc)],
            self.http.blocking.open.load(Ordering::Relaxed) as f64,
        );
        m.gauge("tandem_services", "Services the view holds (local and replicated)", &[("dc", dc)], {
            reg.view().service_count() as f64
        });
        m.gauge("tandem_namespaces", "Namespaces holding a service", &[("dc", dc)], {
            reg.view().namespace_count() as f64
        });
        let refused = "tandem_registrations_refused_total";
        let help = "Local registrations of a new service or namespace refused, by the [limits] cap";
        m.counter(refused, help, &[("dc", dc), ("limit", "services_max")], {
            c.refused_services_max.load(Ordering::Relaxed)
        });
        m.counter(refused, help, &[("dc", dc), ("limit", "namespaces_max")], {
            c.refused_namespaces_max.load(Ordering::Relaxed)
        });
        for (limit, n) in [
            ("namespace_instances_max", &c.refused_quota_instances),
            ("namespace_services_max", &c.refused_quota_services),
            ("namespace_metadata_bytes_max", &c.refused_quota_metadata),
        ] {
            m.counter(refused, help, &[("dc", dc), ("limit", limit)], n.load(Ordering::Relaxed));
        }
        // Per namespace (at most [limits] namespaces_max of them): what its quota counts.
        for (ns, u) in reg.namespace_usage() {
            let l = [("dc", dc), ("namespace", &*ns)];
            m.gauge(
                "tandem_namespace_instances",
                "Own instances of the namespace (its quota counts these)",
                &l,
                u.instances as f64,
            );
            m.gauge(
                "tandem_namespace_services",
                "Services of the namespace, every DC's",
                &l,
                u.services as f64,
            );
            m.gauge(
                "tandem_namespace_metadata_bytes",
                "Metadata bytes (keys and values) of the namespace's own instances",
                &l,
                u.metadata_bytes as f64,
            );
        }
        m.gauge(
            "tandem_owned_instances",
            "Own instances owned by a named principal (not anonymous)",
            &[("dc", dc)],
            reg.owned_instances() as f64,
        );
        self.render_http_limits(&mut m, dc);
        self.render_compat(&mut m, dc);
        render_heap(&mut m, dc);
        let (preservation, pauses_capped) = reg.preservation();
        m.gauge(
            "tandem_self_preservation_active",
            "1 while lease expiry is paused in any namespace",
            &[("dc", dc)],
            u64::from(preservation.iter().any(|p| p.active)) as f64,
        );
        for p in &preservation {
            m.gauge(
                "tandem_self_preservation_paused",
                "1 while lease expiry is paused in this namespace",
                &[("dc", dc), ("namespace", &p.namespace)],
                u64::from(p.active) as f64,
            );
        }
        m.counter(
            "tandem_self_preservation_capped_total",
            "Pauses ended by self_preservation_max_pause_ms",
            &[("dc", dc)],
            pauses_capped,
        );
        m.counter(
            "tandem_lease_checks_total",
            "Passes of the lease checker (one every [health] check_interval_ms)",
            &[("dc", dc)],
            c.lease_checks.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_lease_check_microseconds_total",
            "Time the lease checker spent ticking due leases (its scan, not the write of what it found)",
            &[("dc", dc)],
            c.lease_check_us.load(Ordering::Relaxed),
        );
        m.gauge(
            "tandem_lease_check_microseconds_max",
            "Longest pass of the lease checker's scan since the node started",
            &[("dc", dc)],
            c.lease_check_us_max.load(Ordering::Relaxed) as f64,
        );
        m.gauge("tandem_leases", "Ephemeral leases held", &[("dc", dc)], reg.lease_count() as f64);
        m.gauge("tandem_index", "Watch index", &[("dc", dc)], reg.view().index() as f64);
        let (own, floor, marks) = {
            let l = self.live.read();
            (l.own, l.floor, l.remote.clone())
        };
        m.gauge("tandem_log_last_seq", "Own origin's last seq", &[("dc", dc)], own.seq as f64);
        m.gauge("tandem_log_purge_floor", "Own origin's purge floor", &[("dc", dc)], floor as f64);
        for (owner, n) in reg.counts_by_owner() {
            m.gauge(
                "tandem_instances",
                "Instances held, by owner DC",
                &[("dc", dc), ("owner_dc", &owner)],
                n as f64,
            );
        }
        for (origin, mk) in &marks {
            m.gauge(
                "tandem_applied_seq",
                "Applied high-water mark per origin",
                &[("dc", dc), ("origin", origin)],
                mk.seq as f64,
            );
        }
        if let Some(stats) = &self.gateway_stats {
            let now_mono = self.gateway_clock.elapsed().as_millis() as u64;
            for (peer, p) in stats.peers.lock().iter() {
                let l = [("dc", dc), ("peer", peer.as_str())];
                m.gauge(
                    "tandem_peer_outbound_up",
                    "1 while our stream to the peer is up",
                    &l,
                    u64::from(p.out_connected) as f64,
                );
                m.gauge(
                    "tandem_peer_inbound_up",
                    "1 while the peer's stream to us is up",
                    &l,
                    u64::from(p.in_connected) as f64,
                );
                m.gauge("tandem_peer_acked_seq", "Own seq the peer acknowledged", &l, p.out_acked_seq as f64);
                m.gauge(
                    "tandem_peer_last_contact_seconds",
                    "Seconds since the peer's last frame",
                    &l,
                    now_mono.saturating_sub(p.in_last_contact_mono_ms) as f64 / 1000.0,
                );
                m.gauge(
                    "tandem_peer_lag_events",
                    "Peer's events not yet applied here (within its current epoch)",
                    &l,
                    p.lag_events(marks.get(peer).copied()) as f64,
                );
                m.gauge(
                    "tandem_peer_last_progress_seconds",
                    "Seconds since the peer's link last progressed (a batch applied or a caught-up ping)",
                    &l,
                    now_mono.saturating_sub(p.in_last_progress_mono_ms) as f64 / 1000.0,
                );
                if let Some(v) = p.lag_ms_recent.quantile(0.5) {
                    m.gauge("tandem_peer_lag_ms_p50", "Commit-to-apply lag, recent p50", &l, v as f64);
                }
                if let Some(v) = p.lag_ms_recent.quantile(0.99) {
                    m.gauge("tandem_peer_lag_ms_p99", "Commit-to-apply lag, recent p99", &l, v as f64);
                }
                m.counter(
                    "tandem_replication_out_of_scope_total",
                    "Events and snapshot entries of the peer outside its replication scope here, applied as no-ops",
                    &l,
                    p.events_out_of_scope,
                );
                m.counter(
                    "tandem_peer_snapshots_sent_total",
                    "Snapshots sent to the peer",
                    &l,
                    p.snapshots_sent,
                );
                m.counter(
                    "tandem_peer_log_unreadable_total",
                    "Snapshots sent in place of own log entries that could not be read or were invalid",
                    &l,
                    p.log_unreadable,
                );
                m.counter(
                    "tandem_peer_batches_applied_total",
                    "Batches of the peer's events applied here, each with one synced write",
                    &l,
                    p.batches_applied,
                );
                m.counter(
                    "tandem_peer_snapshots_installed_total",
                    "Snapshots installed from the peer",
                    &l,
                    p.snapshots_installed,
                );
                m.counter(
                    "tandem_peer_snapshot_chunks_sent_total",
                    "Snapshot chunks sent to the peer",
                    &l,
                    p.snapshot_chunks_sent,
                );
                m.counter(
                    "tandem_peer_snapshot_bytes_sent_total",
                    "Entry bytes of the snapshot chunks sent to the peer",
                    &l,
                    p.snapshot_bytes_sent,
                );
                m.counter(
                    "tandem_peer_snapshots_resumed_total",
                    "Snapshots to the peer resumed after a reconnect",
                    &l,
                    p.snapshots_resumed,
                );
                m.counter(
                    "tandem_peer_snapshot_chunks_staged_total",
                    "Snapshot chunks from the peer durably staged",
                    &l,
                    p.snapshot_chunks_staged,
                );
                m.counter(
                    "tandem_peer_snapshot_bytes_staged_total",
                    "Entry bytes of the snapshot chunks staged from the peer",
                    &l,
                    p.snapshot_bytes_staged,
                );
                m.counter(
                    "tandem_peer_snapshots_refused_total",
                    "Snapshots or snapshot chunks from the peer that the log refused",
                    &l,
                    p.snapshots_refused,
                );
            }
            m.counter(
                "tandem_replication_refused_connections_total",
                "Replication connections refused",
                &[("dc", dc)],
                stats.refused_connections.load(Ordering::Relaxed),
            );
            let incoming = "tandem_replication_incoming_refused_total";
            let help = "Incoming replication connections refused before their handshake, by reason";
            m.counter(
                incoming,
                help,
                &[("dc", dc), ("reason", "source")],
                stats.refused_source.load(Ordering::Relaxed),
            );
            m.counter(
                incoming,
                help,
                &[("dc", dc), ("reason", "handshakes_max")],
                stats.refused_handshakes_busy.load(Ordering::Relaxed),
            );
            m.counter(
                "tandem_replication_retries_sent_total",
                "QUIC Retry packets sent to sources that had not validated their address",
                &[("dc", dc)],
                stats.retries_sent.load(Ordering::Relaxed),
            );
            m.gauge(
                "tandem_replication_handshakes",
                "Replication handshakes running now",
                &[("dc", dc)],
                stats.handshakes_in_flight.load(Ordering::Relaxed) as f64,
            );
            m.counter(
                "tandem_replication_refused_retired_total",
                "Replication connections refused because their DC is retired here",
                &[("dc", dc)],
                stats.refused_retired.load(Ordering::Relaxed),
            );
            m.counter(
                "tandem_replication_protocol_errors_total",
                "Replication protocol errors",
                &[("dc", dc)],
                stats.protocol_errors.load(Ordering::Relaxed),
            );
            m.counter(
                "tandem_replication_connections_replaced_total",
                "Peer connections closed because a newer connection of the same DC arrived",
                &[("dc", dc)],
                stats.connections_replaced.load(Ordering::Relaxed),
            );
            m.counter(
                "tandem_replication_connections_idle_closed_total",
                "Peer connections closed because they opened no stream in time",
                &[("dc", dc)],
                stats.connections_idle_closed.load(Ordering::Relaxed),
            );
            m.counter(
                "tandem_replication_frames_too_large_total",
                "Replication frames refused because their declared length exceeded the limit of their type",
                &[("dc", dc)],
                stats.frames_too_large.load(Ordering::Relaxed),
            );
            m.gauge(
                "tandem_replication_fenced",
                "1 when this process is an older incarnation of its DC and ships nothing",
                &[("dc", dc)],
                f64::from(u8::from(stats.fenced.lock().is_some())),
            );
            m.counter(
                "tandem_replication_new_epochs_total",
                "New epochs this process took (history went back, or a new data dir learned of a newer epoch)",
                &[("dc", dc)],
                stats.new_epochs.load(Ordering::Relaxed),
            );
        }
        m.counter(
            "tandem_http_requests_unauthenticated_total",
            "Requests refused with 401: no, unknown or expired token ([acl])",
            &[("dc", dc)],
            self.acl.unauthenticated.load(Ordering::Relaxed),
        );
        m.counter(
            "tandem_http_requests_forbidden_total",
            "Requests refused with 403: the token lacks the scope ([acl])",
            &[("dc", dc)],
            self.acl.forbidden.load(Ordering::Relaxed),
        );
        for (outcome, n) in [
            ("written", self.audit.written.load(Ordering::Relaxed)),
            ("dropped", self.audit.dropped.load(Ordering::Relaxed)),
            ("sampled_out", self.audit.sampled_out.load(Ordering::Relaxed)),
            ("failed", self.audit.failed.load(Ordering::Relaxed)),
        ] {
            m.counter(
                "tandem_audit_lines_total",
                "Audit log lines: written, dropped (queue full), left out by the refusal sampling, failed (I/O)",
                &[("dc", dc), ("outcome", outcome)],
                n,
            );
        }
        m.gauge(
            "tandem_acl_tokens",
            "Tokens loaded (0 with ACLs off)",
            &[("dc", dc)],
            self.acl.current().tokens() as f64,
        );
        let retired = self.live.read().retired.clone();
        for (gone, at_ms) in &retired {
            m.gauge(
                "tandem_dc_retired_since_seconds",
                "Retired DCs (their frames are refused): when each was retired, Unix seconds",
                &[("dc", dc), ("retired", gone)],
                *at_ms as f64 / 1000.0,
            );
        }
        self.render_group(&mut m, dc);
        m.render()
    }
}

impl NodeShared {
    /// The DC group (`[cluster]`): role, term, leader, indexes, forwarding, the member link.
    fn render_group(&self, m: &mut Metrics, dc: &str) {
        let Some(g) = &self.group else { return };
        let st = g.status();
        let node = st.node_id.to_string();
        let labels = [("dc", dc), ("node", node.as_str())];
        let role = match st.role {
            super::group::Role::Leader => "leader",
            super::group::Role::Follower => "follower",
            super::group::Role::Candidate => "candidate",
            super::group::Role::Learner => "learner",
            super::group::Role::Shutdown => "shutdown",
        };
        for r in ["leader", "follower", "candidate", "learner", "shutdown"] {
            m.gauge(
                "tandem_cluster_role",
                "1 for this node's role in its DC's group",
                &[("dc", dc), ("node", node.as_str()), ("role", r)],
                if r == role { 1.0 } else { 0.0 },
            );
        }
        m.gauge(
            "tandem_cluster_serving_writes",
            "1 when this node leads and took over the leases (writes are served here)",
            &labels,
            if st.serving_writes { 1.0 } else { 0.0 },
        );
        m.gauge("tandem_cluster_term", "The Raft term this node is in", &labels, st.term as f64);
        m.gauge(
            "tandem_cluster_leader",
            "The leader this node knows of (0: none)",
            &labels,
            st.leader.unwrap_or(0) as f64,
        );
        m.gauge(
            "tandem_cluster_last_log_index",
            "The last Raft index in this node's log",
            &labels,
            st.last_log_index as f64,
        );
        m.gauge(
            "tandem_cluster_applied_index",
            "The Raft index this node applied",
            &labels,
            st.applied_index as f64,
        );
        for member in &st.members {
            if let Some(matched) = member.matched_index {
                let id = member.id.to_string();
                m.gauge(
                    "tandem_cluster_member_matched_index",
                    "On the leader: the last Raft index each member holds",
                    &[("dc", dc), ("node", node.as_str()), ("member", id.as_str())],
                    matched as f64,
                );
            }
        }
        let (f, link, hb) = (&self.forward_stats, g.link_stats(), g.heartbeat_batch_stats());
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let counters: [(&str, &str, u64); 16] = [
            (
                "tandem_cluster_reads_policy_mismatch_total",
                "Discovery refused: this follower's [failover]/[protection] differ from its leader's (503 policy_mismatch)",
                get(&f.reads_policy_mismatch),
            ),
            (
                "tandem_cluster_heartbeat_batch_fallbacks_total",
                "Heartbeat batches a leader of an earlier version could not decode, sent again one by one",
                get(&hb.fallbacks),
            ),
            (
                "tandem_cluster_heartbeat_forwards_total",
                "Member-link requests that carried heartbeats forwarded to the leader",
                get(&hb.requests),
            ),
            (
                "tandem_cluster_heartbeats_forwarded_total",
                "Heartbeats forwarded to the leader (in those requests)",
                get(&hb.heartbeats),
            ),
            (
                "tandem_cluster_heartbeats_queue_full_total",
                "Heartbeats refused because the forwarding queue was full (503 leader_unreachable)",
                get(&hb.queue_full),
            ),
            (
                "tandem_cluster_writes_forwarded_total",
                "Writes this node forwarded to the leader",
                get(&f.forwarded),
            ),
            (
                "tandem_cluster_writes_forward_failed_total",
                "Forwarded writes that got no answer from the leader (503 leader_unreachable)",
                get(&f.failed),
            ),
            (
                "tandem_cluster_writes_apply_wait_timeouts_total",
                "Forwarded writes answered before this node's apply reached them",
                get(&f.apply_wait_timeouts),
            ),
            (
                "tandem_cluster_writes_no_leader_total",
                "Writes refused for want of a leader (503 no_leader, not_leader)",
                get(&f.no_leader),
            ),
            (
                "tandem_cluster_reads_behind_total",
                "Blocking queries refused: this member had not applied their index when their wait ran out (503 behind)",
                get(&f.reads_behind),
            ),
            (
                "tandem_cluster_writes_served_for_members_total",
                "Writes other members forwarded to this node",
                get(&f.served),
            ),
            ("tandem_member_calls_total", "Requests sent to other members", get(&link.calls)),
            (
                "tandem_member_calls_failed_total",
                "Requests to other members that failed",
                get(&link.calls_failed),
            ),
            ("tandem_member_served_total", "Requests served for other members", get(&link.served)),
            (
                "tandem_member_frames_refused_total",
                "Member-link requests or answers refused for their size",
                get(&link.frames_refused),
            ),
            (
                "tandem_member_connections_refused_total",
                "Member-link connections refused (not a member of this DC, or not admitted)",
                get(&link.refused_connections) + get(&link.refused_admission),
            ),
        ];
        for (name, help, value) in counters {
            m.counter(name, help, &labels, value);
        }
    }

    /// The HTTP side's limits: connections open and refused, closes, refused requests.
    fn render_http_limits(&self, m: &mut Metrics, dc: &str) {
        let h = &self.http;
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        m.gauge(
            "tandem_http_connections",
            "Client connections open now",
            &[("dc", dc)],
            get(&h.connections_open) as f64,
        );
        m.gauge(
            "tandem_http_connections_limit",
            "Client connection cap in force ([http] connections_max within the descriptor budget)",
            &[("dc", dc)],
            get(&h.connections_limit) as f64,
        );
        let refused = "tandem_http_connections_refused_total";
        let help = "Client connections closed at accept, by the limit that refused them";
        m.counter(refused, help, &[("dc", dc), ("limit", "connections_max")], get(&h.refused_total_cap));
        m.counter(
            refused,
            help,
            &[("dc", dc), ("limit", "connections_per_address_max")],
            get(&h.refused_per_address),
        );
        m.counter(refused, help, &[("dc", dc), ("limit", "descriptors")], get(&h.refused_descriptors));
        let closed = "tandem_http_connections_closed_total";
        let help = "Client connections the node closed, by reason";
        m.counter(
            closed,
            help,
            &[("dc", dc), ("reason", "header_read_timeout")],
            get(&h.closed_header_timeout),
        );
        m.counter(
            closed,
            help,
            &[("dc", dc), ("reason", "header_too_large")],
            get(&h.closed_header_too_large),
        );
        m.counter(closed, help, &[("dc", dc), ("reason", "idle")], get(&h.closed_idle));
        let hs = "tandem_http_tls_handshakes_total";
        let help = "HTTPS handshakes on the client API, by outcome (all 0 when [http.tls] is off)";
        let outcomes = [
            ("ok", &h.tls_handshakes_ok),
            ("failed", &h.tls_handshakes_failed),
            ("timed_out", &h.tls_handshakes_timed_out),
            ("plain_http", &h.tls_plain_http),
        ];
        for (outcome, c) in outcomes {
            m.counter(hs, help, &[("dc", dc), ("outcome", outcome)], get(c));
        }
        m.counter(
            "tandem_http_request_timeouts_total",
            "Requests answered 503 request_timeout ([http] request_timeout_ms)",
            &[("dc", dc)],
            get(&h.request_timeouts),
        );
        let req = "tandem_http_requests_refused_total";
        let help = "Requests refused before their handler, by reason";
        m.counter(req, help, &[("dc", dc), ("reason", "host")], get(&h.refused_host));
        m.counter(req, help, &[("dc", dc), ("reason", "admin_unmarked")], get(&h.refused_admin_unmarked));
        m.counter(req, help, &[("dc", dc), ("reason", "admin_rate")], get(&h.refused_admin_rate));
        m.counter(req, help, &[("dc", dc), ("reason", "principal_rate")], get(&h.rates.refused_principal));
        m.counter(req, help, &[("dc", dc), ("reason", "address_rate")], get(&h.rates.refused_address));
        let by_cap = [
            ("watch_streams_max", &h.streams.refused_total),
            ("watch_streams_per_address_max", &h.streams.refused_per_address),
            ("blocking_queries_max", &h.blocking.refused_total),
            ("blocking_queries_per_address_max", &h.blocking.refused_per_address),
        ];
        for (reason, c) in by_cap {
            m.counter(req, help, &[("dc", dc), ("reason", reason)], get(c));
        }
        let (b, help) =
            ("tandem_backups_total", "Backups asked of this node (GET /v1/admin/backup), by result");
        m.counter(b, help, &[("dc", dc), ("result", "served")], get(&h.backups.served));
        m.counter(b, help, &[("dc", dc), ("result", "refused")], get(&h.backups.refused));
        let help = "Bytes of the backups this node served";
        m.counter("tandem_backup_bytes_total", help, &[("dc", dc)], get(&h.backups.bytes));
    }
}

impl NodeShared {
    /// The Consul and Nacos front ends (`crate::compat`).
    fn render_compat(&self, m: &mut Metrics, dc: &str) {
        let c = &self.compat.counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let help = "Consul TTL checks this node times (it serves the DC's writes)";
        m.gauge("tandem_consul_ttl_checks", help, &[("dc", dc)], self.compat.ttl.len() as f64);
        let help = "Consul check passes that changed nothing (heartbeats: nothing written)";
        m.counter("tandem_consul_check_passes_total", help, &[("dc", dc)], get(&c.passes));
        let help = "Consul TTL checks that lapsed (turned critical: one event each)";
        m.counter("tandem_consul_ttl_lapses_total", help, &[("dc", dc)], get(&c.lapses));
        let help = "Consul services deregistered after DeregisterCriticalServiceAfter";
        m.counter("tandem_consul_services_reaped_total", help, &[("dc", dc)], get(&c.reaped));
        let (name, help) =
            ("tandem_compat_refused_total", "Consul, Nacos and HTTP-SD calls refused by a limit");
        for (limit, v) in [
            ("checks_per_service_max", &c.refused_checks),
            ("agent_services_max", &c.refused_agent_services),
            ("sd_targets_max", &c.refused_sd_targets),
            ("filter", &c.refused_filter),
        ] {
            m.counter(name, help, &[("dc", dc), ("limit", limit)], get(v));
        }
    }
}

/// The process's memory, and the trims that gave freed heap back (`heap.rs`).
fn render_heap(m: &mut Metrics, dc: &str) {
    let h = crate::heap::stats();
    m.gauge("process_resident_memory_bytes", "Resident memory of the process", &[], h.rss_bytes as f64);
    let help = "Times the process gave freed heap back to the OS (malloc_trim), by reason";
    for (reason, n) in [("connections", h.trims[0]), ("period", h.trims[1]), ("memtables", h.trims[2])] {
        m.counter("tandem_heap_trims_total", help, &[("dc", dc), ("reason", reason)], n);
    }
    m.counter(
        "tandem_heap_trim_released_bytes_total",
        "Resident memory those trims gave back",
        &[("dc", dc)],
        h.released_bytes,
    );
    m.counter_f64("tandem_heap_trim_seconds_total", "Time spent in those trims", &[("dc", dc)], h.seconds);
}
