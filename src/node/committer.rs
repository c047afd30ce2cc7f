//! [`NodeCommitter`]: the node's committer, over its own RocksLog (a single-node DC) or
//! over its group's log (`[cluster]`: a `GroupLog`, whose writes are Raft entries).

use tokio::sync::watch;

use crate::cluster::GroupLog;
use crate::store::{CommitError, CommitStats, CommitterHandle, LogHealthReport, Retirement, RocksLog};

/// The node's committer, of either kind.
#[derive(Clone)]
pub enum NodeCommitter {
    Single(CommitterHandle<RocksLog>),
    Group(CommitterHandle<GroupLog>),
}

/// Runs `$body` with `$c` bound to the handle, whichever its log.
macro_rules! each {
    ($self:expr, $c:ident => $body:expr) => {
        match $self {
            NodeCommitter::Single($c) => $body,
            NodeCommitter::Group($c) => $body,
        }
    };
}

impl NodeCommitter {
    /// The committer of a single-node DC (None on a group's member).
    pub fn single(&self) -> Option<&CommitterHandle<RocksLog>> {
        match self {
            NodeCommitter::Single(c) => Some(c),
            NodeCommitter::Group(_) => None,
        }
    }
    pub fn stats(&self) -> CommitStats {
        each!(self, c => c.stats())
    }
    pub fn log_health(&self) -> LogHealthReport {
        each!(self, c => c.log_health())
    }
    pub fn own_seq(&self) -> watch::Receiver<u64> {
        each!(self, c => c.own_seq())
    }
    pub async fn retire(&self, dc: String, at_ms: u64) -> Result<Retirement, CommitError> {
        each!(self, c => c.retire(dc, at_ms).await)
    }
    pub async fn unretire(&self, dc: String) -> Result<bool, CommitError> {
        each!(self, c => c.unretire(dc).await)
    }
    pub async fn shutdown(&self) {
        each!(self, c => c.shutdown().await)
    }
}
