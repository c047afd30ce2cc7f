//! The event log's part of `GET /metrics`: synced writes and their durations, group
//! commit, the waits of a local write around its round, the WAL kept, the log's health; and
//! the runtime's lateness, beside the waits it explains.

use super::Metrics;
use crate::shared::NodeShared;

impl NodeShared {
    pub(super) fn render_store(&self, m: &mut Metrics, dc: &str) {
        let stats = self.committer.stats();
        m.counter(
            "tandem_disk_writes_total",
            "Synced RocksDB write batches (heartbeats never add to this)",
            &[("dc", dc)],
            stats.fsyncs,
        );
        m.counter(
            "tandem_store_idle_flushes_total",
            "Quiet spells of the event log that handed its memtables to table files",
            &[("dc", dc)],
            stats.idle_flushes,
        );
        m.counter(
            "tandem_store_idle_flushed_bytes_total",
            "Bytes the memtables held when those quiet spells flushed them",
            &[("dc", dc)],
            stats.idle_flushed_bytes,
        );
        let raft = self.group.as_ref().map(|_| self.data_dir.join(crate::node::group::RAFT_DIR));
        for (store, dir) in [("log", Some(self.data_dir.as_path())), ("raft", raft.as_deref())] {
            let Some(dir) = dir else { continue };
            let help = "Bytes of the WAL files of the store's RocksDB (bounded at 8 memtables' size)";
            m.gauge(
                "tandem_store_wal_bytes",
                help,
                &[("dc", dc), ("store", store)],
                crate::store::wal_files(dir).0 as f64,
            );
        }
        let bounds: Vec<f64> = crate::store::DURATION_BUCKETS_US.iter().map(|us| *us as f64 / 1e6).collect();
        let late = self.runtime_lateness.stats();
        for (name, help, d) in [
            (
                "tandem_disk_sync_duration_seconds",
                "Synced writes of the event log by duration: encoding, memtable, WAL write and its fsync",
                &stats.sync_durations,
            ),
            (
                "tandem_commit_queue_duration_seconds",
                "Local writes (registrations, deregistrations, health changes) by their wait from the request to the start of their round's synced write: the committer's queue, the round in progress, the linger",
                &stats.local_queued,
            ),
            (
                "tandem_commit_answer_duration_seconds",
                "Local writes by their wait from the end of their round's synced write to their answer: the view's apply and the answers before theirs",
                &stats.local_answered,
            ),
            (
                "tandem_runtime_lateness_seconds",
                "Wakes of a timer due every 10 ms on the node's runtime by how late they came: time no worker could run it (every worker busy or blocked, or waiting for a CPU); under 1 ms is the timer's resolution",
                &late.wakes,
            ),
        ] {
            m.histogram(name, help, &[("dc", dc)], &bounds, &d.buckets, d.sum_us as f64 / 1e6);
        }
        let parts = &stats.sync_parts;
        for (part, d) in [("staged", &parts.staged), ("wal", &parts.wal), ("memtable", &parts.memtable)] {
            m.histogram(
                "tandem_disk_sync_part_duration_seconds",
                "The same synced writes by part: staged (the encoding before RocksDB's write call, timed by the committer), wal (the WAL append and its fsync) and memtable (the inserts), timed by RocksDB's perf context",
                &[("dc", dc), ("part", part)],
                &bounds,
                &d.buckets,
                d.sum_us as f64 / 1e6,
            );
        }
        let health = self.committer.log_health();
        m.gauge(
            "tandem_log_writable",
            "1 when the event log takes writes, 0 from a failed write until a recovery",
            &[("dc", dc)],
            if health.writable { 1.0 } else { 0.0 },
        );
        m.counter(
            "tandem_log_write_failures_total",
            "Event log writes that failed and made the log unwritable",
            &[("dc", dc)],
            health.write_failures,
        );
        m.counter(
            "tandem_log_recoveries_total",
            "Recoveries that made the event log writable again",
            &[("dc", dc)],
            health.recoveries,
        );
        m.counter(
            "tandem_log_recovery_attempts_failed_total",
            "Recovery attempts of the event log that failed",
            &[("dc", dc)],
            health.recovery_attempts_failed,
        );
        m.counter(
            "tandem_group_commit_fsyncs_total",
            "Synced writes that carried local appends",
            &[("dc", dc)],
            stats.local_fsyncs,
        );
        m.counter(
            "tandem_group_commit_requests_total",
            "Local appends carried by those writes",
            &[("dc", dc)],
            stats.local_requests,
        );
        m.counter(
            "tandem_group_commit_events_total",
            "Events carried by those writes",
            &[("dc", dc)],
            stats.local_events,
        );
    }
}
