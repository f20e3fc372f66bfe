//! The page at `GET /` in real headless Chromium, driven over WebDriver
//! (`chromedriver` and the `fantoccini` crate): with a fault proxy dropping
//! 30% of the follow frames, the list the page renders equals a fresh
//! `GET /events` walk, in order; and a peer's events that arrive stamped
//! below what the page already showed are marked late.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`browser_support`).

mod browser_support;
mod follow_support;
mod support;

use std::time::{Duration, Instant};

use browser_support::{browser, start_driver};
use fantoccini::Client;
use follow_support::{Faults, WsProxy};
use serde_json::{json, Value};
use support::{append, post_json, start, walk, DEADLINE};

/// `(stream:seq, late)` per rendered event, in the page's order.
async fn rendered(client: &Client) -> Vec<(String, bool)> {
    let value = client
        .execute(
            "return [...document.querySelectorAll('#events li')]
                .map(li => [li.dataset.stream + ':' + li.dataset.seq, li.classList.contains('late')]);",
            vec![],
        )
        .await
        .expect("the script runs");
    serde_json::from_value(value).unwrap()
}

fn names(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| format!("{}:{}", e["stream"].as_str().unwrap(), e["seq"]))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_renders_a_fresh_read_in_order_through_lost_frames() {
    let node = start(1).await;
    let peer = start(2).await;
    let proxy = WsProxy::start(node.addr, 0xb10).await;
    let driver = start_driver().await;
    let client = browser(&driver).await;
    client
        .goto(&format!("{}/?gap_ms=300", proxy.url()))
        .await
        .expect("the page loads");

    // One writer through lossy frames: the page equals the walk, in order.
    proxy.set_faults(Faults {
        drop: 0.3,
        ..Faults::none()
    });
    for i in 0..30 {
        append(node.addr, format!("n{i}").as_bytes()).await;
    }
    let expected = names(&walk(node.addr, 100).await);
    let started = Instant::now();
    loop {
        let shown: Vec<String> = rendered(&client)
            .await
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        if shown == expected {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the page shows {shown:?}, a fresh read {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let notes: String = serde_json::from_value(
        client
            .execute(
                "return document.getElementById('notes').textContent;",
                vec![],
            )
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(
        notes.contains("gap refetched"),
        "the loss was felt and refetched: {notes}"
    );
    proxy.heal();

    // A peer's events stamped below what the page showed arrive late.
    for i in 0..3 {
        append(peer.addr, format!("p{i}").as_bytes()).await;
    }
    let added = post_json(node.addr, "/peers", &json!({"url": peer.url()})).await;
    assert_eq!(added.status, 201);
    let started = Instant::now();
    loop {
        let shown = rendered(&client).await;
        if shown.len() == 33 {
            let late: Vec<&str> = shown
                .iter()
                .filter(|(_, l)| *l)
                .map(|(n, _)| n.as_str())
                .collect();
            assert_eq!(
                late,
                ["2:1", "2:2", "2:3"],
                "the peer's events are marked late"
            );
            let mut all: Vec<String> = shown.into_iter().map(|(n, _)| n).collect();
            let mut fresh = names(&walk(node.addr, 100).await);
            all.sort();
            fresh.sort();
            assert_eq!(all, fresh, "every event once");
            break;
        }
        assert!(started.elapsed() < DEADLINE, "the page shows {shown:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status: String = serde_json::from_value(
        client
            .execute(
                "return document.getElementById('status').textContent;",
                vec![],
            )
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(
        status.contains("\"marks\""),
        "the status stream shows: {status}"
    );
    client.close().await.unwrap();
}
