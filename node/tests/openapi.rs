//! `docs/openapi.json` is the document a node serves at `GET /openapi.json`
//! and the one `meshlog openapi` prints, byte for byte; and the document
//! is the router: every route it serves is documented with every method,
//! every documented operation is served, protected routes name the role
//! they need with their `401` and `403`, and every error answer carries
//! the error JSON.
//!
//! To refresh the committed copy after changing the API:
//! `cargo run -p meshlog-node -- openapi > docs/openapi.json`, or run this
//! test with `UPDATE_OPENAPI=1`.

mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;
use support::*;

/// Every route the router serves, with each method.
const ROUTES: [(&str, &str); 20] = [
    ("get", "/"),
    ("get", "/checkpoint"),
    ("post", "/compact"),
    ("get", "/compaction"),
    ("post", "/compaction"),
    ("get", "/events"),
    ("post", "/events"),
    ("get", "/events/append"),
    ("post", "/events/query"),
    ("get", "/follow"),
    ("get", "/health"),
    ("get", "/marks"),
    ("get", "/forks"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    ("delete", "/peers"),
    ("get", "/peers"),
    ("post", "/peers"),
    ("get", "/sync"),
    ("post", "/verify"),
];

/// The role each route needs (issue 10); the rest are open over HTTP.
const PROTECTED: [(&str, &str, &str); 15] = [
    ("get", "/events", "read"),
    ("get", "/checkpoint", "read"),
    ("post", "/events/query", "read"),
    ("get", "/marks", "read"),
    ("get", "/forks", "read"),
    ("get", "/follow", "read"),
    ("post", "/events", "write"),
    ("get", "/events/append", "write"),
    ("post", "/compact", "admin"),
    ("get", "/compaction", "admin"),
    ("post", "/compaction", "admin"),
    ("post", "/verify", "admin"),
    ("get", "/peers", "admin"),
    ("post", "/peers", "admin"),
    ("delete", "/peers", "admin"),
];

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json")
}

const REGENERATE: &str = "regenerate it with `cargo run -p meshlog-node -- openapi > \
     docs/openapi.json` (or run this test with UPDATE_OPENAPI=1) and commit it";

/// The first line where two texts differ, for the failure message.
fn first_difference(committed: &str, served: &str) -> String {
    let mut committed_lines = committed.lines();
    let mut served_lines = served.lines();
    for line in 1.. {
        match (committed_lines.next(), served_lines.next()) {
            (None, None) => break,
            (c, s) if c == s => continue,
            (c, s) => {
                return format!(
                    "line {line}: committed {:?}, served {:?}",
                    c.unwrap_or("<end>"),
                    s.unwrap_or("<end>")
                )
            }
        }
    }
    "they differ only in line endings".into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_is_the_committed_one() {
    let node = start(1).await;
    let response = get(node.addr, "/openapi.json").await;
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("application/json"));
    let served = String::from_utf8(response.body).expect("the document is UTF-8");
    let path = committed_path();
    if std::env::var_os("UPDATE_OPENAPI").is_some_and(|value| value == "1") {
        std::fs::write(&path, &served).expect("docs/openapi.json is writable");
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == served,
        "docs/openapi.json is not what GET /openapi.json serves ({}); {REGENERATE}",
        first_difference(&committed, &served)
    );
}

#[test]
fn meshlog_openapi_prints_the_committed_document() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_meshlog"))
        .arg("openapi")
        .output()
        .expect("meshlog runs");
    assert!(output.status.success(), "{output:?}");
    let printed = String::from_utf8(output.stdout).expect("UTF-8");
    let committed = std::fs::read_to_string(committed_path()).unwrap_or_default();
    assert!(
        committed == printed,
        "docs/openapi.json is not what `meshlog openapi` prints ({}); {REGENERATE}",
        first_difference(&committed, &printed)
    );
}

fn document() -> Value {
    serde_json::from_str(&meshlog_node::http::openapi::document()).expect("the document is JSON")
}

fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("a path item").keys() {
            found.insert((method.clone(), path.clone()));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_and_the_router_serve_the_same_routes() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    let routes: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(method, path)| (method.to_string(), path.to_string()))
        .collect();
    assert_eq!(operations(&doc), routes);
    // Each is served: the router answers neither `not_found` nor
    // `method_not_allowed` (bodies are empty, so most answer 400).
    let node = start(1).await;
    for (method, path) in ROUTES {
        let response = request(node.addr, &method.to_uppercase(), path, &[], b"").await;
        assert!(
            ![404, 405].contains(&response.status) || response.error() == "unknown_peer",
            "{method} {path} answered {}: {:?}",
            response.status,
            String::from_utf8_lossy(&response.body)
        );
    }
    // And a method the document does not list is not served.
    let response = request(node.addr, "PUT", "/events", &[], b"").await;
    assert_eq!(response.status, 405);
}

#[test]
fn protected_routes_name_their_role_and_answer_401_and_403() {
    let doc = document();
    let scheme = &doc["components"]["securitySchemes"]["bearer"];
    assert_eq!(scheme["type"], "http");
    assert_eq!(scheme["scheme"], "bearer");
    for (method, path) in operations(&doc) {
        let operation = &doc["paths"][&path][&method];
        let role = PROTECTED
            .iter()
            .find(|(m, p, _)| *m == method && *p == path)
            .map(|(_, _, role)| *role);
        match role {
            Some(role) => {
                assert_eq!(
                    operation["security"],
                    serde_json::json!([{"bearer": [role]}]),
                    "{method} {path}"
                );
                for status in ["401", "403"] {
                    assert!(
                        operation["responses"].get(status).is_some(),
                        "{method} {path} has no {status}"
                    );
                }
            }
            None => {
                assert!(operation.get("security").is_none(), "{method} {path}");
                // The peer link's 401 is the handshake's, not a bearer's.
                if path != "/sync" {
                    assert!(
                        operation["responses"].get("401").is_none(),
                        "{method} {path}"
                    );
                }
            }
        }
    }
}

/// A response object, through a `#/components/responses/...` reference.
fn resolve<'a>(doc: &'a Value, response: &'a Value) -> &'a Value {
    match response["$ref"].as_str() {
        Some(reference) => {
            let name = reference
                .strip_prefix("#/components/responses/")
                .expect("a response reference");
            &doc["components"]["responses"][name]
        }
        None => response,
    }
}

#[test]
fn every_error_answer_is_the_error_json() {
    let doc = document();
    for (method, path) in operations(&doc) {
        let responses = doc["paths"][&path][&method]["responses"]
            .as_object()
            .expect("responses");
        for status in ["408", "413", "431", "503"] {
            assert!(
                responses.contains_key(status),
                "{method} {path} has no {status}"
            );
        }
        for (status, response) in responses {
            // 431 comes from the HTTP layer, before the router: no body.
            if !status.starts_with('4') && !status.starts_with('5') || status == "431" {
                continue;
            }
            let schema = &resolve(&doc, response)["content"]["application/json"]["schema"];
            assert_eq!(
                schema["$ref"], "#/components/schemas/ErrorJson",
                "{method} {path} {status}"
            );
        }
    }
}
