//! The simulated network between the DCs: which links are cut, connections that drop,
//! delays, and the replication streams carried frame by frame through the real codec.

use super::*;

impl World {
    pub(super) fn linked(&self, a: usize, b: usize) -> bool {
        self.cut_until.get(&(a.min(b), a.max(b))).is_none_or(|until| self.now >= *until)
            && self.dcs[a].node.is_some()
            && self.dcs[b].node.is_some()
    }

    pub(super) fn drop_conn(&mut self, origin: usize, peer: usize) {
        let Some(conn) = self.conns.remove(&(origin, peer)) else { return };
        self.dial_at.insert((origin, peer), self.now + BACKOFF_MS + self.rng.gen_range(0..BACKOFF_MS));
        // Half-open: the peer's receiver may still apply batches that were on the wire,
        // later, behind the next connection's (at-least-once redelivery).
        if self.dcs[peer].node.is_some() && self.rng.gen_bool(0.5) {
            for (_, f) in conn.to_peer {
                if let Frame::Batch { events, .. } = f {
                    let at = self.now + self.rng.gen_range(0..2_000);
                    self.lingering.push((at, peer, origin, events));
                }
            }
        }
    }

    pub(super) fn delay(&mut self) -> u64 {
        self.p.delay_ms + self.rng.gen_range(0..=self.p.jitter_ms)
    }

    pub(super) fn network(&mut self) {
        let n = self.dcs.len();
        // Dial.
        for (o, p) in (0..n).flat_map(|o| (0..n).map(move |p| (o, p))).filter(|(o, p)| o != p) {
            let due = self.dial_at.get(&(o, p)).is_none_or(|t| self.now >= *t);
            if self.conns.contains_key(&(o, p)) || !due || !self.linked(o, p) {
                continue;
            }
            let (sender, hello) = {
                let log = self.dcs[o].node.as_ref().map(|n| n.log()).expect("linked");
                Sender::new(
                    log,
                    DC_NAMES[p],
                    StreamTuning {
                        batch_events_max: 8,
                        window_batches_max: 4,
                        ping_interval_ms: 500,
                        ..StreamTuning::default()
                    },
                    self.now,
                )
            };
            let at = self.now + self.delay();
            let mut to_peer = VecDeque::new();
            to_peer.push_back((at, hello));
            self.conns.insert(
                (o, p),
                Conn {
                    sender,
                    receiver: Receiver::new(DC_NAMES[p], DC_NAMES[o]),
                    to_peer,
                    to_origin: VecDeque::new(),
                },
            );
        }
        let keys: Vec<(usize, usize)> = self.conns.keys().copied().collect();
        for (o, p) in keys {
            if !self.linked(o, p) {
                self.drop_conn(o, p);
                continue;
            }
            if let Err(e) = self.run_conn(o, p) {
                self.log_trace(|| format!("stream {o}->{p} ends: {e}"));
                self.drop_conn(o, p);
            }
        }
        // Lingering receivers of dead connections.
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.lingering).into_iter().partition(|l| l.0 <= now);
        self.lingering = later;
        for (_, peer, origin, events) in due {
            if let Some(node) = self.dcs[peer].node.as_mut() {
                self.oracle.counts.duplicate_batches += 1;
                let h = node.handle.clone();
                let _ = node.drive(async move { h.apply_remote(DC_NAMES[origin].to_owned(), events).await });
            }
        }
    }

    pub(super) fn run_conn(&mut self, o: usize, p: usize) -> Result<(), String> {
        // Origin transmits.
        for _ in 0..16 {
            let conn = self.conns.get_mut(&(o, p)).ok_or("gone")?;
            let log = self.dcs[o].node.as_ref().ok_or("down")?.log();
            let frame = match conn.sender.poll_transmit(log, self.now).map_err(|e| e.to_string())? {
                Some((frame, _)) => frame,
                None => match conn.sender.poll_snapshot().map_err(|e| e.to_string())? {
                    Some((frame, _)) => frame,
                    None => break,
                },
            };
            let frame = wire(&frame);
            let last = conn.to_peer.back().map_or(0, |f| f.0);
            let at = (self.now + self.p.delay_ms + self.rng.gen_range(0..=self.p.jitter_ms)).max(last);
            self.conns.get_mut(&(o, p)).ok_or("gone")?.to_peer.push_back((at, frame));
        }
        // Frames reaching the peer.
        loop {
            let conn = self.conns.get_mut(&(o, p)).ok_or("gone")?;
            let Some(&(at, _)) = conn.to_peer.front() else { break };
            if at > self.now {
                break;
            }
            let (_, frame) = conn.to_peer.pop_front().ok_or("empty")?;
            let log = self.dcs[p].node.as_ref().ok_or("down")?.log();
            let (mark, mark_id) = (log.mark_of(DC_NAMES[o]), log.mark_event_id(DC_NAMES[o]));
            let actions = conn.receiver.handle_frame(mark, mark_id, frame).map_err(|e| e.to_string())?;
            for action in actions {
                let reply = match action {
                    ReceiverAction::Send(f) => Some(f),
                    ReceiverAction::Apply { batch_id, events } => {
                        let node = self.dcs[p].node.as_mut().ok_or("down")?;
                        let h = node.handle.clone();
                        let origin = DC_NAMES[o].to_owned();
                        let report = node
                            .drive(async move { h.apply_remote(origin, events).await })
                            .map_err(|e| e.to_string())?;
                        let conn = self.conns.get_mut(&(o, p)).ok_or("gone")?;
                        Some(conn.receiver.applied(batch_id, &report).map_err(|e| e.to_string())?)
                    }
                    ReceiverAction::Install { batch_id, snapshot } => {
                        let node = self.dcs[p].node.as_mut().ok_or("down")?;
                        let h = node.handle.clone();
                        let origin = DC_NAMES[o].to_owned();
                        let report = node
                            .drive(async move { h.install_snapshot(origin, snapshot).await })
                            .map_err(|e| e.to_string())?;
                        self.oracle.counts.snapshots += 1;
                        let conn = self.conns.get_mut(&(o, p)).ok_or("gone")?;
                        Some(conn.receiver.applied(batch_id, &report).map_err(|e| e.to_string())?)
                    }
                    ReceiverAction::StageChunk { batch_id, chunk } => {
                        let node = self.dcs[p].node.as_mut().ok_or("down")?;
                        let h = node.handle.clone();
                        let origin = DC_NAMES[o].to_owned();
                        let (id, index) = (chunk.snapshot_id, chunk.index);
                        let outcome = node
                            .drive(async move { h.stage_snapshot_chunk(origin, chunk).await })
                            .map_err(|e| e.to_string())?;
                        let conn = self.conns.get_mut(&(o, p)).ok_or("gone")?;
                        match outcome {
                            ChunkOutcome::Staged(_) => Some(conn.receiver.chunk_staged(batch_id, id, index)),
                            ChunkOutcome::Installed(report) => {
                                self.oracle.counts.snapshots += 1;
                                let conn = self.conns.get_mut(&(o, p)).ok_or("gone")?;
                                Some(conn.receiver.applied(batch_id, &report).map_err(|e| e.to_string())?)
                            }
                        }
                    }
                    ReceiverAction::PurgeTombstones { upto_seq } => {
                        let node = self.dcs[p].node.as_mut().ok_or("down")?;
                        let h = node.handle.clone();
                        let origin = DC_NAMES[o].to_owned();
                        let _ = node.drive(async move { h.purge_remote_tombstones(origin, upto_seq).await });
                        None
                    }
                    ReceiverAction::Contact { .. } => None,
                };
                if let Some(f) = reply {
                    let d = self.delay();
                    let conn = self.conns.get_mut(&(o, p)).ok_or("gone")?;
                    let last = conn.to_origin.back().map_or(0, |f| f.0);
                    conn.to_origin.push_back(((self.now + d).max(last), wire(&f)));
                }
            }
        }
        // Frames reaching the origin.
        loop {
            let conn = self.conns.get_mut(&(o, p)).ok_or("gone")?;
            let Some(&(at, _)) = conn.to_origin.front() else { break };
            if at > self.now {
                break;
            }
            let (_, frame) = conn.to_origin.pop_front().ok_or("empty")?;
            let log = self.dcs[o].node.as_ref().ok_or("down")?.log();
            let events = conn.sender.handle_frame(log, frame).map_err(|e| e.to_string())?;
            for ev in events {
                if let SenderEvent::PeerAcked(mark) = ev {
                    let node = self.dcs[o].node.as_mut().ok_or("down")?;
                    let h = node.handle.clone();
                    let _ = node.drive(async move { h.record_peer_ack(DC_NAMES[p].to_owned(), mark).await });
                }
            }
        }
        Ok(())
    }
}

/// A frame through the real wire codec.
fn wire(frame: &Frame) -> Frame {
    decode_frame(&encode_frame(frame), SNAPSHOT_FRAME_BYTES_MAX).expect("a frame decodes")
}
