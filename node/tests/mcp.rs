//! `meshlog mcp`, driven by a real MCP client (rmcp's, over the child
//! process's stdio) against a real node: the tools and their documented
//! input schema, appending, walking the log with the token the CLI printed
//! (one token everywhere), a bounded follow (on the node's push channel,
//! not a poll), and a node's errors (stale, malformed) coming back as tool
//! errors with the node's reason.

mod cli_support;
mod support;

use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use support::DEADLINE;

type Client = RunningService<RoleClient, ()>;

/// Starts `meshlog mcp --node URL` and connects rmcp's client to it.
async fn connect(node: &str) -> Client {
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_meshlog")).configure(|cmd| {
        cmd.args(["mcp", "--node", node]).env_remove("MESHLOG_NODE");
    });
    let transport = TokioChildProcess::new(command).expect("meshlog mcp starts");
    tokio::time::timeout(DEADLINE, ().serve(transport))
        .await
        .expect("the MCP handshake within the deadline")
        .expect("the MCP handshake")
}

async fn call(client: &Client, tool: &str, arguments: Value) -> CallToolResult {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(arguments.as_object().expect("an object").clone());
    tokio::time::timeout(DEADLINE, client.call_tool(params))
        .await
        .unwrap_or_else(|_| panic!("{tool}: no answer within {DEADLINE:?}"))
        .unwrap_or_else(|error| panic!("{tool}: {error}"))
}

/// The JSON text of a tool's answer, and whether it is a tool error.
fn body(result: &CallToolResult) -> (Value, bool) {
    let text = result
        .content
        .first()
        .and_then(|content| content.as_text())
        .map(|text| text.text.clone())
        .expect("a text answer");
    let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    (value, result.is_error == Some(true))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_pages_the_log_with_the_token_the_cli_printed() {
    let node = support::start(1).await;
    let url = node.url();
    let client = connect(&url).await;

    // The tools, each with its arguments documented in the input schema.
    let tools = client.list_all_tools().await.expect("tools");
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    for expected in [
        "page_events",
        "follow_events",
        "append_events",
        "read_marks",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    let page_tool = tools
        .iter()
        .find(|tool| tool.name == "page_events")
        .unwrap();
    let schema = Value::Object(page_tool.input_schema.as_ref().clone());
    for argument in ["after", "limit"] {
        let description = schema["properties"][argument]["description"]
            .as_str()
            .unwrap_or_default();
        assert!(
            !description.is_empty(),
            "`{argument}` undocumented in {schema}"
        );
    }
    assert!(schema["properties"]["after"]["description"]
        .as_str()
        .unwrap()
        .contains("token"));

    // Appends through MCP and through the CLI land in the same log.
    let (appended, error) = body(
        &call(
            &client,
            "append_events",
            json!({"payloads": ["one", "two", "three"]}),
        )
        .await,
    );
    assert!(!error, "{appended}");
    assert_eq!(appended["events"].as_array().unwrap().len(), 3);
    let run = cli_support::cli(&["append", "--node", &url, "four", "five"], "").await;
    assert_eq!(run.code, Some(0), "{run:?}");

    // The CLI reads two events and prints its token; MCP resumes from it.
    let run = cli_support::cli(&["events", "--node", &url, "--limit", "2"], "").await;
    assert_eq!(run.code, Some(0), "{run:?}");
    let mut token = run.next();
    let mut payloads = Vec::new();
    loop {
        let (page, error) =
            body(&call(&client, "page_events", json!({"after": token, "limit": 2})).await);
        assert!(!error, "{page}");
        for event in page["events"].as_array().unwrap() {
            payloads.push(event["payload"].as_str().unwrap().to_owned());
        }
        token = page["next"].as_str().unwrap().to_owned();
        if page["at_head"] == json!(true) {
            break;
        }
    }
    assert_eq!(
        payloads,
        ["three", "four", "five"],
        "every event after the CLI's token, once"
    );

    // The token MCP answered is the node's: the CLI accepts it back.
    let run = cli_support::cli(&["events", "--node", &url, "--after", &token], "").await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.next(), token);

    // A bounded follow: nothing new within the wait gives an empty page
    // with the same token; an append during the wait is returned.
    let started = Instant::now();
    let (idle, error) = body(
        &call(
            &client,
            "follow_events",
            json!({"after": token, "wait_ms": 300}),
        )
        .await,
    );
    assert!(!error);
    assert!(idle["events"].as_array().unwrap().is_empty());
    assert_eq!(idle["next"].as_str().unwrap(), token);
    assert!(started.elapsed() >= Duration::from_millis(300));
    let appender = {
        let addr = node.addr;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            support::append(addr, b"arrives while following").await
        })
    };
    let (followed, error) = body(
        &call(
            &client,
            "follow_events",
            json!({"after": token, "wait_ms": 10_000}),
        )
        .await,
    );
    assert!(!error);
    appender.await.unwrap();
    assert_eq!(
        followed["events"][0]["payload"],
        json!("arrives while following")
    );

    let (marks, error) = body(&call(&client, "read_marks", json!({})).await);
    assert!(!error);
    assert_eq!(marks["marks"]["1"], json!(6));

    client.cancel().await.expect("the session closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_errors_come_back_as_tool_errors_with_its_reason() {
    let node = support::start(1).await;
    let client = connect(&node.url()).await;
    for i in 0..6 {
        support::append(node.addr, format!("event {i}").as_bytes()).await;
    }
    let (first, _) = body(&call(&client, "page_events", json!({"limit": 2})).await);
    let stale_token = first["next"].as_str().unwrap().to_owned();
    let compacted = support::post_json(
        node.addr,
        "/compact",
        &json!({"keep_last": 1, "ignore_peers": true}),
    )
    .await;
    assert_eq!(compacted.status, 200);

    // Stale: the node's 410 body, with the exact range lost and the token
    // to resume from.
    let (stale, error) = body(&call(&client, "page_events", json!({"after": stale_token})).await);
    assert!(error, "a stale token must be a tool error: {stale}");
    assert_eq!(stale["error"], json!("stale_cursor"));
    assert_eq!(stale["lost"][0]["first"], json!(3));
    assert_eq!(stale["lost"][0]["last"], json!(5));
    let resume = stale["resume"].as_str().unwrap();
    let (rest, error) = body(&call(&client, "page_events", json!({"after": resume})).await);
    assert!(!error);
    assert_eq!(rest["events"][0]["payload"], json!("event 5"));

    // Malformed: the codec's reason.
    let (malformed, error) =
        body(&call(&client, "page_events", json!({"after": "not a token!"})).await);
    assert!(error);
    assert_eq!(malformed["error"], json!("bad_token"));
    assert!(!malformed["message"].as_str().unwrap().is_empty());

    // Out of range: the node's limit error.
    let (limit, error) = body(&call(&client, "page_events", json!({"limit": 0})).await);
    assert!(error);
    assert_eq!(limit["error"], json!("bad_limit"));

    // A node that is not there: said plainly, not a hang.
    let gone = connect("http://127.0.0.1:9").await;
    let (unreachable, error) = body(&call(&gone, "read_marks", json!({})).await);
    assert!(error);
    assert_eq!(unreachable["error"], json!("node_unreachable"));
    gone.cancel().await.unwrap();
    client.cancel().await.unwrap();
}

/// A metric's value in the node's `GET /metrics` text.
async fn metric(addr: std::net::SocketAddr, name: &str) -> f64 {
    let text = String::from_utf8(support::get(addr, "/metrics").await.body).unwrap();
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name).then(|| value.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no metric {name} in {text}"))
}

/// Regression (issue 25): `follow_events` polled the node every 100 ms
/// where a push channel exists. It now waits on `GET /follow`: while it
/// waits the node serves it a follow subscription (a poll holds none, and
/// this test would time out waiting for one), an event appended then is
/// the answer, and the whole call pages the node exactly twice (the page
/// that found nothing, the page after the push), however long it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_events_waits_on_the_push_channel_not_a_poll() {
    let node = support::start(1).await;
    let client = connect(&node.url()).await;
    support::append(node.addr, b"before").await;
    let (page, error) = body(&call(&client, "page_events", json!({})).await);
    assert!(!error);
    let token = page["next"].as_str().unwrap().to_owned();
    let pages_before = metric(node.addr, "meshlog_pages_total").await;

    let addr = node.addr;
    let (followed, appended) = tokio::join!(
        call(
            &client,
            "follow_events",
            json!({"after": token, "wait_ms": 30_000}),
        ),
        async move {
            support::wait_until(
                "the MCP follow holds a follow subscription",
                || async move { metric(addr, "meshlog_followers").await == 1.0 },
            )
            .await;
            support::append(addr, b"pushed").await
        }
    );
    let (followed, error) = body(&followed);
    assert!(!error, "{followed}");
    assert_eq!(appended, 2);
    assert_eq!(followed["events"][0]["payload"], json!("pushed"));
    assert_eq!(followed["events"].as_array().unwrap().len(), 1);
    let pages = metric(node.addr, "meshlog_pages_total").await - pages_before;
    assert_eq!(pages, 2.0, "a follow that pages more than twice polls");

    client.cancel().await.expect("the session closes");
}

/// Issue 27: `follow_events` with a version-2 token from another node.
/// A's head token names a checkpoint C (its peer, gossip off) does not
/// keep; the MCP server at C pages from it (C fetches the checkpoint
/// from A), finds nothing, and waits on C's push channel from that
/// cursor: an event appended then is the answer. Before, the follow
/// could not read a version-2 token and answered the empty page at once
/// (the append was never waited for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_events_waits_from_a_version_2_token_of_another_node() {
    let a_dir = tempfile::tempdir().unwrap();
    support::checkpointed_dir(a_dir.path());
    let a = support::node_in(a_dir, 1, vec![], 10_000).await;
    let c = support::node_in(tempfile::tempdir().unwrap(), 3, vec![a.url()], 10_000).await;
    support::wait_until("c holds a's events", || async {
        support::marks(c.addr).await["marks"] == support::marks(a.addr).await["marks"]
    })
    .await;
    let head = support::get(a.addr, "/events?limit=1000").await.json();
    assert_eq!(head["at_head"], true);
    let token = head["next"].as_str().unwrap().to_owned();
    assert!(
        matches!(
            meshlog_cursor::token::decode_any_text(&token),
            Ok(meshlog_cursor::token::Token::Relative(_))
        ),
        "a version-2 token: {token}"
    );

    let client = connect(&c.url()).await;
    let addr = c.addr;
    let (followed, appended) = tokio::join!(
        call(
            &client,
            "follow_events",
            json!({"after": token, "wait_ms": 30_000}),
        ),
        async move {
            support::wait_until(
                "the MCP follow holds a follow subscription",
                || async move { metric(addr, "meshlog_followers").await == 1.0 },
            )
            .await;
            support::append(addr, b"pushed").await
        }
    );
    let (followed, error) = body(&followed);
    assert!(!error, "{followed}");
    assert_eq!(appended, 1);
    assert_eq!(followed["events"][0]["payload"], json!("pushed"));
    assert_eq!(followed["events"].as_array().unwrap().len(), 1);
    client.cancel().await.expect("the session closes");
}
