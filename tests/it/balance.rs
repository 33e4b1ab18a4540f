//! `balance_with`: each request starts at the least busy of the route's balanced upstreams,
//! equals taking turns, and the others follow as fallbacks.

use crate::support::*;
use hourglass::config::Config;
use hourglass::server::{self, Running};
use hourglass_fake::FakeUpstream;

async fn balanced(a_extra: &str) -> (FakeUpstream, FakeUpstream, Running) {
    let (mut fakes, gw) = balanced_over(2, a_extra).await;
    let b = fakes.pop().unwrap();
    (fakes.pop().unwrap(), b, gw)
}

/// A route over `n` fakes, `a` its upstream and `b`, `c` ... balanced with it.
async fn balanced_over(n: usize, a_extra: &str) -> (Vec<FakeUpstream>, Running) {
    let mut fakes = Vec::new();
    for _ in 0..n {
        fakes.push(
            FakeUpstream::start("127.0.0.1:0".parse().unwrap())
                .await
                .unwrap(),
        );
    }
    let names: Vec<String> = (0..n).map(|i| char::from(b'a' + i as u8).into()).collect();
    let mut text = String::from(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[defaults]
budget = "10s"
first_token_timeout = "5s"

[[routes]]
name = "chat"
path_prefix = "/v1/chat/completions"
upstream = "a"
"#,
    );
    let others: Vec<String> = names[1..].iter().map(|n| format!("{n:?}")).collect();
    text += &format!("balance_with = [{}]\n", others.join(", "));
    for (name, fake) in names.iter().zip(&fakes) {
        let extra = if name == "a" { a_extra } else { "" };
        text += &format!(
            "\n[upstreams.{name}]\nurl = \"{}\"\nauth = \"none\"\n{extra}\n",
            fake.url()
        );
    }
    let gw = server::start(Config::from_toml(&text, "balance.toml").unwrap())
        .await
        .unwrap();
    (fakes, gw)
}

async fn chat(gw: &Running, headers: &[(&str, &str)]) -> u16 {
    let (resp, _c) = Conn::open(gw.addr)
        .await
        .send(chat_request(headers, true))
        .await;
    let status = resp.status().as_u16();
    let read = read_body(resp.into_body()).await;
    assert!(read.text().ends_with("data: [DONE]\n\n"), "{}", read.text());
    status
}

#[tokio::test]
async fn equally_busy_upstreams_take_turns() {
    let (a, b, gw) = balanced("").await;
    for _ in 0..6 {
        assert_eq!(chat(&gw, &[("x-fake-chunks", "1")]).await, 200);
    }
    assert_eq!((a.requests().len(), b.requests().len()), (3, 3));
}

#[tokio::test]
async fn a_request_starts_at_the_least_busy_upstream() {
    let (a, b, gw) = balanced("").await;
    // A long stream holds one of them.
    let (long, conn) = Conn::open(gw.addr)
        .await
        .send(chat_request(
            &[("x-fake-chunks", "3"), ("x-fake-interval-ms", "2000")],
            true,
        ))
        .await;
    assert_eq!(long.status(), 200);
    let busy_is_a = a.requests().len() == 1;
    assert_eq!(b.requests().len(), usize::from(!busy_is_a));
    for _ in 0..4 {
        assert_eq!(chat(&gw, &[("x-fake-chunks", "1")]).await, 200);
    }
    let (busy, idle) = if busy_is_a { (&a, &b) } else { (&b, &a) };
    assert_eq!(
        busy.requests().len(),
        1,
        "a request went to the busy upstream"
    );
    assert_eq!(idle.requests().len(), 4);
    drop((long, conn));
}

#[tokio::test]
async fn a_failing_balanced_upstream_falls_back_to_the_other_and_is_then_passed_over() {
    let (a, b, gw) = balanced("eject_after = 1\neject_for = \"10m\"").await;
    a.set_script(&[("x-fake-status", "503")]);
    for _ in 0..4 {
        assert_eq!(chat(&gw, &[("x-fake-chunks", "1")]).await, 200);
    }
    // The first request started at a (its turn), failed there and went on to b; a was
    // then out of rotation, and nothing started there again.
    assert_eq!((a.requests().len(), b.requests().len()), (1, 4));
    assert_eq!(
        metric(
            gw.admin_addr,
            "hourglass_fallbacks_total{from=\"a\",route=\"chat\",to=\"b\"}"
        )
        .await,
        1.0
    );
    // Both directions exist from start-up.
    assert_eq!(
        metric(
            gw.admin_addr,
            "hourglass_fallbacks_total{from=\"b\",route=\"chat\",to=\"a\"}"
        )
        .await,
        0.0
    );
}

/// Equals take turns among themselves whatever the others do: with one of three upstreams
/// busy, the other two share the requests evenly. The search for the least busy started one
/// upstream further each time, so the one after the busy one won two ties in three.
#[tokio::test]
async fn equals_take_turns_evenly_while_another_is_busy() {
    let (fakes, gw) = balanced_over(3, "").await;
    let (long, conn) = Conn::open(gw.addr)
        .await
        .send(chat_request(
            &[("x-fake-chunks", "3"), ("x-fake-interval-ms", "3000")],
            true,
        ))
        .await;
    assert_eq!(long.status(), 200);
    let busy = fakes
        .iter()
        .position(|f| f.requests().len() == 1)
        .expect("the long stream went somewhere");
    for _ in 0..12 {
        assert_eq!(chat(&gw, &[("x-fake-chunks", "1")]).await, 200);
    }
    let counts: Vec<usize> = fakes.iter().map(|f| f.requests().len()).collect();
    let mut expected = vec![6, 6, 6];
    expected[busy] = 1;
    assert_eq!(counts, expected, "the busy one is {busy}");
    drop((long, conn));
}
