//! `stale` means "not progressing": a link whose handshakes keep arriving but whose
//! sessions never apply anything turns stale, a caught-up idle link stays fresh, and lag is
//! counted within the origin's current epoch.

use tandem_replicator::gateway::PeerLink;
use tandem_replicator::protocol::{Receiver, ReceiverAction};
use tandem_schemas::{Frame, Mark};

fn contact(actions: &[ReceiverAction]) -> (u64, u64, bool) {
    actions
        .iter()
        .find_map(|a| match a {
            ReceiverAction::Contact { epoch, last_seq, caught_up, .. } => {
                Some((*epoch, *last_seq, *caught_up))
            }
            _ => None,
        })
        .expect("a contact")
}

const EPOCH: u64 = 7;

#[test]
fn a_handshake_is_contact_but_never_progress() {
    let mark = Some(Mark { epoch: EPOCH, seq: 9 });
    let mut r = Receiver::new("dc-b", "dc-a");
    let hello = Frame::Hello { dc: "dc-a".into(), epoch: EPOCH, last_seq: 9 };
    // Even a caught-up handshake is not progress: a session may be refused right after.
    assert_eq!(contact(&r.handle_frame(mark, None, hello).unwrap()), (EPOCH, 9, false));
    // A ping that finds the receiver holding all the origin has is progress.
    let ping = Frame::Ping { last_seq: 9, floor_seq: 0, now_ms: 1 };
    assert_eq!(contact(&r.handle_frame(mark, None, ping).unwrap()), (EPOCH, 9, true));
    // A ping that says the origin is ahead is not.
    let ping = Frame::Ping { last_seq: 12, floor_seq: 0, now_ms: 2 };
    assert_eq!(contact(&r.handle_frame(mark, None, ping).unwrap()), (EPOCH, 12, false));
}

#[test]
fn reconnects_that_never_progress_turn_stale() {
    let stale_after = 5_000;
    let mut link = PeerLink::default();
    link.on_frame(1, 1_000);
    link.on_progress(1_000);
    assert!(!link.stale(5_000, stale_after));
    // A handshake every 500 ms for 10 s, each session refused: contact, no progress.
    let mut now = 1_000;
    while now < 11_000 {
        now += 500;
        link.on_frame(now, now);
        link.on_origin_position(EPOCH, 20);
    }
    assert!(link.stale(now, stale_after), "handshakes alone must not keep copies fresh");
    // A batch applied makes it fresh again.
    link.on_progress(now);
    assert!(!link.stale(now + 1, stale_after));
}

#[test]
fn lag_is_counted_within_the_origins_current_epoch() {
    let mut link = PeerLink::default();
    link.on_origin_position(1, 900);
    assert_eq!(link.lag_events(Some(Mark { epoch: 1, seq: 890 })), 10);
    // The origin's history restarted (a new epoch) at seq 5: the old epoch's 900 is not
    // its position any more.
    link.on_origin_position(2, 5);
    assert_eq!(link.in_origin_last_seq, 5);
    assert_eq!(link.lag_events(Some(Mark { epoch: 2, seq: 3 })), 2);
    // Applied marks of an older epoch count as nothing applied of the new one.
    assert_eq!(link.lag_events(Some(Mark { epoch: 1, seq: 900 })), 5);
    // Within one epoch the position only moves forward.
    link.on_origin_position(2, 4);
    assert_eq!(link.in_origin_last_seq, 5);
}
