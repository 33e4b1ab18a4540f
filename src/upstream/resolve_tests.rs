use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Semaphore;
use tower_service::Service;

use super::*;

/// A resolver whose lookups block until the test lets one through, as a `getaddrinfo`
/// waiting on a nameserver that does not answer does.
#[derive(Clone)]
struct Held {
    calls: Arc<AtomicUsize>,
    gate: Arc<Semaphore>,
}

impl Default for Held {
    fn default() -> Self {
        Self {
            calls: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
}

impl Service<Name> for Held {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let gate = Arc::clone(&self.gate);
        Box::pin(async move {
            // One permit, one lookup: it is not given back.
            gate.acquire().await.map_err(io::Error::other)?.forget();
            if name.as_str() == "nx.invalid" {
                return Err(io::Error::new(io::ErrorKind::NotFound, "no such name"));
            }
            // Each lookup answers a different address: a waiter can tell which it got.
            Ok(vec![SocketAddr::from(([127, 0, 0, 1 + n as u8], 0))].into_iter())
        })
    }
}

fn name(s: &str) -> Name {
    Name::from_str(s).expect("name")
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn concurrent_lookups_of_one_name_share_one_lookup_and_a_later_one_looks_again() {
    let held = Held::default();
    let resolver = SharedResolver::with(held.clone());
    let waiting: Vec<_> = (0..100)
        .map(|_| tokio::spawn(resolver.clone().call(name("up.example"))))
        .collect();
    settle().await;
    assert_eq!(held.calls.load(Ordering::SeqCst), 1);
    held.gate.add_permits(1);
    for w in waiting {
        let addrs: Vec<_> = w.await.expect("task").expect("lookup").collect();
        assert_eq!(addrs, [SocketAddr::from(([127, 0, 0, 1], 0))]);
    }
    // Nothing kept: a lookup after that one ended is a lookup of its own.
    held.gate.add_permits(1);
    let addrs: Vec<_> = resolver
        .clone()
        .call(name("up.example"))
        .await
        .expect("lookup")
        .collect();
    assert_eq!(held.calls.load(Ordering::SeqCst), 2);
    assert_eq!(addrs, [SocketAddr::from(([127, 0, 0, 2], 0))]);
}

#[tokio::test]
async fn a_lookup_abandoned_by_every_waiter_still_holds_its_name_until_it_ends() {
    let held = Held::default();
    let resolver = SharedResolver::with(held.clone());
    // Connects that gave up at their bound: their futures are dropped.
    for _ in 0..50 {
        let given_up = tokio::spawn(resolver.clone().call(name("hung.example")));
        settle().await;
        given_up.abort();
    }
    settle().await;
    assert_eq!(held.calls.load(Ordering::SeqCst), 1);
    // Other names are not held up behind it.
    let other = tokio::spawn(resolver.clone().call(name("other.example")));
    settle().await;
    assert_eq!(held.calls.load(Ordering::SeqCst), 2);
    held.gate.add_permits(2);
    other.await.expect("task").expect("lookup");
}

#[tokio::test]
async fn a_failed_lookup_is_every_waiters_error() {
    let held = Held::default();
    let resolver = SharedResolver::with(held.clone());
    let waiting: Vec<_> = (0..3)
        .map(|_| tokio::spawn(resolver.clone().call(name("nx.invalid"))))
        .collect();
    settle().await;
    held.gate.add_permits(1);
    for w in waiting {
        let e = w.await.expect("task").expect_err("no such name");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(e.to_string(), "no such name");
    }
    assert_eq!(held.calls.load(Ordering::SeqCst), 1);
}

/// A lookup that hangs is joined only while young: a connect a second later starts its own,
/// which answers once the nameserver does, and the old one ending does not drop the new one
/// from the map (audit HC 1: every connect after the nameserver recovered waited on the one
/// hung lookup, 504, and the upstream was ejected).
#[tokio::test(start_paused = true)]
async fn a_hung_lookup_is_joined_only_while_young() {
    let held = Held::default();
    let resolver = SharedResolver::with(held.clone());
    let first = tokio::spawn(resolver.clone().call(name("slow.example")));
    settle().await;
    tokio::time::advance(JOIN_WITHIN / 2).await;
    let joined = tokio::spawn(resolver.clone().call(name("slow.example")));
    settle().await;
    assert_eq!(
        held.calls.load(Ordering::SeqCst),
        1,
        "a young lookup is joined"
    );
    tokio::time::advance(JOIN_WITHIN).await;
    let fresh = tokio::spawn(resolver.clone().call(name("slow.example")));
    settle().await;
    assert_eq!(held.calls.load(Ordering::SeqCst), 2, "an old one is not");
    // One permit: the first lookup ends (its two waiters get 127.0.0.1); the second is the
    // name's lookup in flight still, and a connect now joins it.
    held.gate.add_permits(1);
    for w in [first, joined] {
        let addrs: Vec<_> = w.await.expect("task").expect("lookup").collect();
        assert_eq!(addrs, [SocketAddr::from(([127, 0, 0, 1], 0))]);
    }
    let also = tokio::spawn(resolver.clone().call(name("slow.example")));
    settle().await;
    assert_eq!(
        held.calls.load(Ordering::SeqCst),
        2,
        "the younger lookup stays joinable"
    );
    held.gate.add_permits(1);
    for w in [fresh, also] {
        let addrs: Vec<_> = w.await.expect("task").expect("lookup").collect();
        assert_eq!(addrs, [SocketAddr::from(([127, 0, 0, 2], 0))]);
    }
}
