//! The `status` stream's frame, built in one place: the node's marks,
//! floor, digest and peers (what `GET /marks` answers), and what the
//! console at `GET /` draws from it: every link's state, lag and
//! freshness, every writer's head, floor and last event time, and the
//! counters its rates are computed from.

use std::collections::HashMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use meshlog_cursor::{token, StreamId};
use meshlog_sync::PeerStatus;

use super::frame::{LinkJson, StatusJson, WriterJson};
use crate::http::json::{chains_json, decimal, digest_json, vector_json};
use crate::http::AppState;
use crate::peers::REFUSED_PREFIX;
use crate::replica::NodeReplica;

/// The status frame now.
pub(crate) fn status(state: &AppState) -> StatusJson {
    let replica = &state.replica;
    let marks = replica.marks();
    let floor = replica.floor();
    let digest = replica.digest();
    let stats = replica.stats();
    let dialed = state.peers.list();
    let inbound = state.peers.inbound();
    let now = Instant::now();
    let links = dialed
        .iter()
        .map(|peer| link_json("dialed", peer.addr.clone(), peer, now))
        .chain(
            inbound
                .iter()
                .map(|peer| link_json("inbound", peer.addr.to_string(), peer, now)),
        )
        .collect();
    let writers = {
        let mut times = state.follow.head_times();
        marks
            .iter()
            .map(|(stream, head)| {
                let floor_seq = floor.get(stream);
                WriterJson {
                    stream: decimal(stream),
                    head,
                    floor: floor_seq,
                    held: head.saturating_sub(floor_seq),
                    last_time_ms: (head > floor_seq)
                        .then(|| times.time_ms(replica, stream, head))
                        .flatten(),
                }
            })
            .collect()
    };
    StatusJson {
        stream: "status".into(),
        node: decimal(replica.stream()),
        marks: vector_json(&marks),
        floor: vector_json(&floor),
        // The replica's own marks are within the token's bounds.
        token: token::encode_text(&marks).expect("a cursor of this node encodes"),
        digest: digest_json(digest),
        chains: chains_json(&replica.chain_digest()),
        peers: dialed.iter().map(crate::http::peer_json).collect(),
        time_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64),
        appended: stats.appended,
        received: stats.applied,
        links,
        writers,
    }
}

/// When each stream's head event was appended, as last read: a status
/// frame is built on every change for every status follower, and only a
/// stream whose head moved since is read again (one event, from the
/// store's cache or disk). One entry per stream held, so bounded by
/// `streams_max`.
#[derive(Default)]
pub(crate) struct HeadTimes {
    /// Per stream, the head read and its event's time.
    read: HashMap<StreamId, (u64, Option<u64>)>,
}

impl HeadTimes {
    /// The time of `stream`'s event `head`, read only if not read before.
    fn time_ms(&mut self, replica: &NodeReplica, stream: StreamId, head: u64) -> Option<u64> {
        match self.read.get(&stream) {
            Some(&(read, time_ms)) if read == head => time_ms,
            _ => {
                let time_ms = replica.event_time_ms(stream, head);
                self.read.insert(stream, (head, time_ms));
                time_ms
            }
        }
    }
}

/// One link as the status stream shows it.
fn link_json<A>(direction: &str, peer: String, status: &PeerStatus<A>, now: Instant) -> LinkJson {
    let (state, reason) = link_state(status);
    LinkJson {
        direction: direction.into(),
        peer,
        stream: status.stream.map(decimal),
        state: state.into(),
        reason,
        lag_events: status.lag_events,
        exchange_age_ms: status
            .session
            .last_frame_at
            .map(|at| now.saturating_duration_since(at).as_millis() as u64),
    }
}

/// A link's state and, when it is not `up`, why.
fn link_state<A>(status: &PeerStatus<A>) -> (&'static str, Option<String>) {
    if status.connected {
        let limits = &status.session.limits;
        if limits.is_empty() {
            return ("up", None);
        }
        let reasons: Vec<String> = limits
            .iter()
            .map(|hit| crate::http::json::link_limit_json(hit).reason)
            .collect();
        return ("limit", Some(reasons.join("; ")));
    }
    match &status.last_error {
        Some(error) if error.starts_with(REFUSED_PREFIX) => ("refused", Some(error.clone())),
        Some(error) => ("reconnecting", Some(error.clone())),
        None if status.connects == 0 => ("connecting", None),
        None => ("reconnecting", None),
    }
}

#[cfg(test)]
mod tests {
    //! The link states the console colours, from a link's status alone.

    use meshlog_cursor::{StreamId, VersionVector};
    use meshlog_sync::{LimitHit, PeerDirection, PeerStatus, SessionState};

    use super::link_state;

    fn link(connected: bool, connects: u64, last_error: Option<&str>) -> PeerStatus<String> {
        PeerStatus {
            addr: "http://127.0.0.1:1".into(),
            direction: PeerDirection::Outbound,
            connected,
            stream: connected.then(|| StreamId::new(2)),
            marks: VersionVector::new(),
            lag_events: 0,
            connects,
            last_error: last_error.map(str::to_owned),
            session: SessionState::default(),
        }
    }

    #[test]
    fn each_link_state_is_named_with_its_reason() {
        assert_eq!(link_state(&link(true, 1, None)), ("up", None));
        // An error from an earlier session does not darken a running one.
        assert_eq!(link_state(&link(true, 2, Some("reset"))), ("up", None));
        assert_eq!(link_state(&link(false, 0, None)), ("connecting", None));
        let down = link_state(&link(false, 1, Some("dial failed: refused")));
        assert_eq!(down.0, "reconnecting");
        assert_eq!(down.1.as_deref(), Some("dial failed: refused"));
        let refused = "peer answered 401 Unauthorized to the sync upgrade: {}";
        assert_eq!(link_state(&link(false, 0, Some(refused))).0, "refused");
        let mut limited = link(true, 1, None);
        limited.session.limits.push(LimitHit::StreamsMax {
            stream: StreamId::new(9),
            limit: 4,
        });
        let (state, reason) = link_state(&limited);
        assert_eq!(state, "limit");
        assert!(reason.unwrap().contains("streams_max 4"));
        // A writer the trust configuration does not admit: the link stays
        // up, limited, and says which stream.
        let mut stranger = link(true, 1, None);
        stranger.session.limits.push(LimitHit::UnknownWriter {
            stream: StreamId::new(9),
            key: None,
        });
        let (state, reason) = link_state(&stranger);
        assert_eq!(state, "limit");
        let reason = reason.unwrap();
        assert!(
            reason.contains("stream 9") && reason.contains("not admitted"),
            "{reason}"
        );
    }
}
