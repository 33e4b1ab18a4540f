//! Which lane a stream is put on. No request is sent: the slots alone are counted.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use super::StreamSlot;
use crate::config::Config;
use crate::upstream::Upstream;

fn upstream(keys: &str) -> Upstream {
    let toml = format!(
        "[upstreams.u]\nurl = \"http://127.0.0.1:9\"\nauth = \"none\"\n{keys}\n\n\
         [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n"
    );
    let config = Config::from_toml(&toml, "test").expect("config");
    Upstream::new(config.upstreams[0].clone(), Duration::from_secs(1)).expect("upstream")
}

fn slots(u: &Upstream, n: usize) -> Vec<StreamSlot> {
    (0..n).map(|_| u.clients.slot()).collect()
}

#[test]
fn a_full_lane_opens_the_next_and_a_freed_place_is_taken_first() {
    let u = upstream("http2 = \"always\"\nhttp2_max_streams_per_connection = 2");
    let mut held = slots(&u, 5);
    assert_eq!(u.clients.counts(), [2, 2, 1]);
    // A stream ending on the first lane makes room there, and the first lane with room wins.
    held.remove(0);
    assert_eq!(u.clients.counts(), [1, 2, 1]);
    held.push(u.clients.slot());
    assert_eq!(u.clients.counts(), [2, 2, 1]);
    drop(held);
    assert_eq!(u.clients.counts(), [0, 0, 0]);
    // Lanes are kept and reused: the peak decides how many there are.
    let _again = slots(&u, 6);
    assert_eq!(u.clients.counts(), [2, 2, 2]);
}

#[test]
fn past_the_connection_cap_the_least_loaded_lane_takes_more() {
    let u = upstream(
        "http2 = \"always\"\nhttp2_max_streams_per_connection = 2\nhttp2_max_connections = 2",
    );
    let held = slots(&u, 7);
    assert_eq!(u.clients.counts(), [4, 3]);
    drop(held);
    assert_eq!(u.clients.counts(), [0, 0]);
}

#[test]
fn an_upstream_without_http2_has_one_lane_without_a_limit() {
    for keys in ["", "http2 = \"never\""] {
        let u = upstream(keys);
        let _held = slots(&u, 250);
        assert_eq!(u.clients.counts(), [250], "{keys:?}");
    }
    // The same keys over TLS mean HTTP/2 by ALPN: the limit applies.
    let toml = "[upstreams.u]\nurl = \"https://127.0.0.1:9\"\nauth = \"none\"\n\
                http2_max_streams_per_connection = 100\n\n\
                [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n";
    let config = Config::from_toml(toml, "test").expect("config");
    let u = Upstream::new(config.upstreams[0].clone(), Duration::from_secs(1)).expect("upstream");
    let _held = slots(&u, 250);
    assert_eq!(u.clients.counts(), [100, 100, 50]);
}

#[test]
fn racing_takers_never_overfill_a_lane() {
    let u = Arc::new(upstream(
        "http2 = \"always\"\nhttp2_max_streams_per_connection = 2",
    ));
    let start = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (u, start) = (u.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                slots(&u, 25)
            })
        })
        .collect();
    let held: Vec<Vec<StreamSlot>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    // With no stream ending, a lane opens only when every other is full: exactly 50, each
    // with 2, whatever the interleaving.
    assert_eq!(u.clients.counts(), vec![2; 50]);
    drop(held);
}

#[test]
fn a_retired_lane_takes_no_new_streams_and_counts_until_they_end() {
    let u = upstream(
        "http2 = \"always\"\nhttp2_max_streams_per_connection = 2\nhttp2_max_connections = 2",
    );
    let held = slots(&u, 3);
    assert_eq!(u.clients.counts(), [2, 1]);
    // The first lane's connection went silent: its streams stay until they end, and it
    // counts against the cap meanwhile, so new streams go to the other lane.
    held[0].retire(false);
    let more = slots(&u, 3);
    assert_eq!(
        u.clients.counts(),
        [2, 4],
        "the cap holds: the second takes them"
    );
    let retired = Arc::downgrade(&held[0].lane);
    drop(held);
    // Its streams ended: it goes, and a fresh first lane stands in for it.
    let again = slots(&u, 1);
    assert!(retired.upgrade().is_none(), "gone with its streams");
    assert_eq!(u.clients.counts(), [1, 3]);
    drop((more, again));
    assert_eq!(u.clients.counts(), [0, 0]);
}

#[test]
fn when_every_lane_is_retired_a_fresh_one_opens_past_the_cap() {
    let u = upstream(
        "http2 = \"always\"\nhttp2_max_streams_per_connection = 2\nhttp2_max_connections = 1",
    );
    let held = slots(&u, 2);
    held[0].retire(false);
    // No lane would take streams: one more connection opens while the old one drains.
    let _more = slots(&u, 1);
    assert_eq!(u.clients.counts(), [1, 2]);
}

#[test]
fn over_http1_nothing_is_retired() {
    let u = upstream("");
    let held = slots(&u, 2);
    held[0].retire(false);
    let _more = slots(&u, 1);
    assert_eq!(u.clients.counts(), [3]);
    // `auto` over TLS: the lanes may hold HTTP/1.1 connections (ALPN chose it), whose
    // pooled idle connections a retirement would throw away. Only an HTTP/2 one retires.
    let toml = "[upstreams.u]\nurl = \"https://127.0.0.1:9\"\nauth = \"none\"\n\
                http2_max_streams_per_connection = 2\n\n\
                [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n";
    let config = Config::from_toml(toml, "test").expect("config");
    let u = Upstream::new(config.upstreams[0].clone(), Duration::from_secs(1)).expect("upstream");
    let held = slots(&u, 1);
    held[0].retire(false);
    let _more = slots(&u, 1);
    assert_eq!(u.clients.counts(), [2], "HTTP/1.1 by ALPN: kept");
    held[0].retire(true);
    let _again = slots(&u, 1);
    assert_eq!(u.clients.counts(), [1, 2], "HTTP/2 by ALPN: retired");
}

#[test]
fn a_retired_lane_lets_its_connection_go_with_its_last_stream() {
    let u = upstream("http2 = \"always\"\nhttp2_max_streams_per_connection = 2");
    let held = slots(&u, 2);
    held[0].retire(false);
    // The first lane is replaced, the retired one kept while its streams drain.
    let fresh = slots(&u, 1);
    assert_eq!(u.clients.counts(), [1, 2]);
    let retired = Arc::clone(&held[0].lane);
    assert!(retired.client.load().is_some());
    drop(held);
    // No later request has to come by for its client (and connection) to go: the fresh
    // lane has room, so nothing looks through the others (audit H: open 65 s after).
    assert!(
        retired.client.load().is_none(),
        "its client went with its last stream"
    );
    assert!(fresh[0].lane.client.load().is_some());
}

/// A provider's SETTINGS that announce fewer streams than the lanes' own limit cap the lane
/// its connection is on, and a lane opened after them starts at that cap, before its own
/// connection's SETTINGS arrive (audit Z2: a burst put 48 streams on a new connection of a
/// provider that takes 2, and a GOAWAY lost them).
#[test]
fn the_provider_s_lower_stream_limit_caps_every_lane() {
    use std::sync::atomic::Ordering;
    let u = upstream("http2 = \"always\"");
    // What the first connection's SETTINGS did (`io.rs`): the lane's limit and the upstream's.
    u.clients
        .first
        .load()
        .peer_streams
        .store(2, Ordering::Release);
    u.clients
        .connector
        .peer_streams_seen
        .store(2, Ordering::Release);
    let held = slots(&u, 5);
    assert_eq!(u.clients.counts(), [2, 2, 1]);
    drop(held);
}

/// Audit RA 5: a limit that cuts a stream retires its HTTP/2 connection only when the whole
/// connection read nothing (`io::LastRead`) for the route's idle limit; a read of any stream
/// within it keeps the connection. Over HTTP/1.1 nothing is watched.
#[tokio::test(start_paused = true)]
async fn a_cut_retires_a_connection_that_read_nothing_for_the_idle_limit() {
    let idle = Duration::from_millis(300);
    let u = upstream("http2 = \"always\"");
    let held = slots(&u, 1);
    let watch = held[0].watch(false).expect("an HTTP/2 stream is watched");
    // No read yet says nothing (the head of a stream always comes by one).
    watch.retire_if_silent(Duration::ZERO);
    assert!(!held[0].lane.is_retired());
    held[0].lane.last_read.stamp();
    tokio::time::advance(idle - Duration::from_millis(1)).await;
    watch.retire_if_silent(idle);
    assert!(!held[0].lane.is_retired(), "it read within the idle limit");
    tokio::time::advance(Duration::from_millis(1)).await;
    watch.retire_if_silent(idle);
    assert!(held[0].lane.is_retired(), "silent for the whole idle limit");
    // The next stream goes to a fresh lane, and the retired one goes with its last stream.
    let retired = Arc::clone(&held[0].lane);
    let fresh = slots(&u, 1);
    assert!(!Arc::ptr_eq(&fresh[0].lane, &retired));
    drop(held);
    assert!(retired.client.load().is_none());

    assert!(slots(&upstream(""), 1)[0].watch(true).is_none(), "HTTP/1.1");
    // `auto` over TLS: watched when ALPN chose HTTP/2.
    let toml = "[upstreams.u]\nurl = \"https://127.0.0.1:9\"\nauth = \"none\"\n\n\
                [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n";
    let config = Config::from_toml(toml, "test").expect("config");
    let u = Upstream::new(config.upstreams[0].clone(), Duration::from_secs(1)).expect("upstream");
    let held = slots(&u, 1);
    assert!(held[0].watch(false).is_none(), "HTTP/1.1 by ALPN");
    assert!(held[0].watch(true).is_some(), "HTTP/2 by ALPN");
}
