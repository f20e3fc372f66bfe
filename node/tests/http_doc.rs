//! `docs/HTTP.md` is true: every `console` example in it is replayed, in the
//! page's order, against fresh nodes (stream 1 on the page's
//! `127.0.0.1:7070`, stream 2 standing in for `127.0.0.1:7071`), and the
//! status, the content type and the body must match what the page shows.
//! Bodies are compared key by key and value by value, except the events'
//! `time` (in a compact page's runs, an event's second item), the
//! digest's `sum`, the chain heads' `hash`es and the writer's
//! `public_key` (they depend on the clock or a new key; their type is
//! checked) and each peer's and inbound session's state (it depends on
//! timing; its shape is checked). Prometheus text is compared line by line: every `#` line
//! exactly, every sample by its name. Also: every route of the API has an
//! example.

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;

use serde_json::Value;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DOC: &str = include_str!("../../docs/HTTP.md");

/// The routes the router serves; each must have an example.
const ROUTES: [(&str, &str); 19] = [
    ("GET", "/health"),
    ("POST", "/events"),
    ("GET", "/events"),
    ("POST", "/events/query"),
    ("GET", "/marks"),
    ("GET", "/forks"),
    ("GET", "/checkpoint"),
    ("POST", "/compact"),
    ("GET", "/compaction"),
    ("POST", "/compaction"),
    ("POST", "/verify"),
    ("GET", "/peers"),
    ("POST", "/peers"),
    ("DELETE", "/peers"),
    ("GET", "/sync"),
    ("GET", "/follow"),
    ("GET", "/"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
];

#[derive(Debug)]
struct Example {
    command: String,
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

/// Every `$ command` of every `console` block, with the response below it.
fn examples() -> Vec<Example> {
    let mut examples = Vec::new();
    let mut in_block = false;
    let mut current: Option<(String, Vec<String>)> = None;
    for line in DOC.lines() {
        if !in_block {
            in_block = line == "```console";
            continue;
        }
        if line == "```" || line.starts_with("$ ") {
            if let Some((command, lines)) = current.take() {
                examples.push(example(command, lines));
            }
            if line == "```" {
                in_block = false;
            } else {
                current = Some((line[2..].to_owned(), Vec::new()));
            }
            continue;
        }
        current
            .as_mut()
            .expect("a console block starts with `$ `")
            .1
            .push(line.to_owned());
    }
    examples
}

fn example(command: String, lines: Vec<String>) -> Example {
    let mut lines = lines.into_iter();
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("`{command}`: no `HTTP/1.1 NNN` line below it"));
    let mut headers = Vec::new();
    let mut body = String::new();
    let mut in_body = false;
    for line in lines {
        if in_body {
            body.push_str(&line);
            body.push('\n');
        } else if line.is_empty() {
            in_body = true;
        } else {
            let (name, value) = line.split_once(": ").expect("a header line");
            headers.push((name.to_ascii_lowercase(), value.to_owned()));
        }
    }
    Example {
        command,
        status,
        headers,
        body,
    }
}

/// Splits a shell command line: words, single and double quotes, `|`.
fn shell_words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut has_word = false;
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                has_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                has_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        c => word.push(c),
                    }
                }
            }
            ' ' => {
                if has_word {
                    words.push(std::mem::take(&mut word));
                    has_word = false;
                }
            }
            c => {
                has_word = true;
                word.push(c);
            }
        }
    }
    if has_word {
        words.push(word);
    }
    words
}

struct Request {
    method: String,
    addr: SocketAddr,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// The request a `curl` command line (optionally fed by `printf ... |`)
/// sends, with the page's addresses replaced by the test nodes'.
fn parse_command(command: &str, a: SocketAddr, b: SocketAddr) -> Request {
    let words = shell_words(command);
    let (stdin, curl) = match words.iter().position(|w| w == "|") {
        Some(pipe) => {
            assert_eq!(
                words[0], "printf",
                "`{command}`: only printf pipes into curl"
            );
            (Some(words[1].replace("\\n", "\n")), &words[pipe + 1..])
        }
        None => (None, &words[..]),
    };
    assert_eq!(curl[0], "curl", "`{command}`");
    let mut method = None;
    let mut headers = Vec::new();
    let mut body = None;
    let mut url = None;
    let mut args = curl[1..].iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-s" | "-i" | "-si" => {}
            "--max-time" => {
                args.next();
            }
            "-X" => method = args.next().cloned(),
            "-H" => {
                let (name, value) = args.next().unwrap().split_once(": ").unwrap();
                headers.push((name.to_ascii_lowercase(), value.to_owned()));
            }
            "-d" | "--data-binary" => {
                let data = args.next().unwrap();
                let data = if data == "@-" {
                    stdin.clone().expect("stdin for @-")
                } else {
                    data.clone()
                };
                body = Some(data.replace("http://127.0.0.1:7071", &format!("http://{b}")));
            }
            other if other.starts_with("http://") => url = Some(other.to_owned()),
            other => panic!("`{command}`: unknown curl argument {other}"),
        }
    }
    if body.is_some() && !headers.iter().any(|(name, _)| name == "content-type") {
        // What curl sends with -d.
        headers.push((
            "content-type".into(),
            "application/x-www-form-urlencoded".into(),
        ));
    }
    let url = url.expect("a URL");
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let addr = match host {
        "127.0.0.1:7070" => a,
        "127.0.0.1:7071" => b,
        other => panic!("`{command}`: unknown host {other}"),
    };
    let method = method.unwrap_or_else(|| {
        if body.is_some() {
            "POST".into()
        } else {
            "GET".into()
        }
    });
    Request {
        method,
        addr,
        path: path.to_owned(),
        headers,
        body: body.unwrap_or_default().into_bytes(),
    }
}

/// Compares a documented JSON value with the real one; see the file's docs
/// for what is loose.
fn compare(expected: &Value, actual: &Value, path: &str, shape_only: bool) -> Result<(), String> {
    let key = path.rsplit('.').next().unwrap_or("");
    let kind = |v: &Value| std::mem::discriminant(v);
    // A compact page's event is `[lamport, time, payload]`: its time is
    // its second item.
    let compact_time =
        path.contains(".runs[") && key.starts_with("events[") && path.ends_with("][1]");
    if key == "time" || key == "sum" || key == "hash" || key == "public_key" || compact_time {
        return if kind(expected) == kind(actual) {
            Ok(())
        } else {
            Err(format!("{path}: type differs"))
        };
    }
    if shape_only && key == "marks" {
        // A peer's acknowledged marks grow as its session runs.
        return if actual.is_object() {
            Ok(())
        } else {
            Err(format!("{path}: not an object"))
        };
    }
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            let ek: BTreeSet<&String> = e.keys().collect();
            let ak: BTreeSet<&String> = a.keys().collect();
            if ek != ak {
                return Err(format!("{path}: keys {ek:?} documented, {ak:?} answered"));
            }
            for (k, v) in e {
                let timed = k == "peers" || k == "inbound";
                compare(v, &a[k], &format!("{path}.{k}"), shape_only || timed)?;
            }
            Ok(())
        }
        (Value::Array(e), Value::Array(a)) if shape_only => match (e.first(), a.first()) {
            (Some(e), Some(a)) => compare(e, a, &format!("{path}[0]"), true),
            _ => Ok(()),
        },
        (Value::Array(e), Value::Array(a)) => {
            if e.len() != a.len() {
                return Err(format!(
                    "{path}: {} items documented, {} answered",
                    e.len(),
                    a.len()
                ));
            }
            e.iter()
                .zip(a)
                .enumerate()
                .try_for_each(|(i, (e, a))| compare(e, a, &format!("{path}[{i}]"), false))
        }
        _ if shape_only => Ok(()),
        _ if expected == actual => Ok(()),
        _ => Err(format!("{path}: {expected} documented, {actual} answered")),
    }
}

async fn upgrade_head(request: &Request) -> support::Response {
    let mut stream = tokio::net::TcpStream::connect(request.addr).await.unwrap();
    let mut head = format!(
        "{} {} HTTP/1.1\r\nhost: {}\r\n",
        request.method, request.path, request.addr
    );
    for (name, value) in &request.headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(DEADLINE, stream.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed before the response head");
        answer.extend_from_slice(&buf[..n]);
    }
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    parse_response(&answer[..end + 4]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_example_in_http_md_is_what_the_node_answers() {
    let a = start(1).await;
    let b = start(2).await;
    let examples = examples();
    assert!(
        examples.len() >= 20,
        "only {} examples found",
        examples.len()
    );
    let mut covered = BTreeSet::new();
    for example in &examples {
        let request = parse_command(&example.command, a.addr, b.addr);
        covered.insert((
            request.method.clone(),
            request.path.split('?').next().unwrap().to_owned(),
        ));
        let response = if example.status == 101 {
            upgrade_head(&request).await
        } else {
            let headers: Vec<(&str, &str)> = request
                .headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            support::request(
                request.addr,
                &request.method,
                &request.path,
                &headers,
                &request.body,
            )
            .await
        };
        let context = format!("`{}`", example.command);
        assert_eq!(
            response.status,
            example.status,
            "{context}: {:?}",
            String::from_utf8_lossy(&response.body)
        );
        for (name, value) in &example.headers {
            assert_eq!(
                response.header(name),
                Some(value.as_str()),
                "{context}: header {name}"
            );
        }
        let documented = example.body.trim();
        if documented.is_empty() {
            continue;
        }
        let answered = String::from_utf8(response.body.clone()).unwrap();
        if documented.starts_with('{') {
            let documented: Value =
                serde_json::from_str(&documented.replace("127.0.0.1:7071", &b.addr.to_string()))
                    .unwrap_or_else(|e| panic!("{context}: the documented body is not JSON: {e}"));
            let answered: Value = serde_json::from_str(&answered).unwrap();
            if let Err(difference) = compare(&documented, &answered, "$", false) {
                panic!("{context}: {difference}\nanswered: {answered}");
            }
        } else {
            for line in documented.lines() {
                let found = if line.starts_with('#') {
                    answered.lines().any(|l| l == line)
                } else {
                    let name = line.split(' ').next().unwrap();
                    answered.lines().any(|l| l.starts_with(&format!("{name} ")))
                };
                assert!(
                    found,
                    "{context}: documented line {line:?} not answered in\n{answered}"
                );
            }
        }
    }
    for (method, path) in ROUTES {
        assert!(
            covered.contains(&(method.to_owned(), path.to_owned())),
            "no example of {method} {path} in docs/HTTP.md"
        );
    }
}

#[test]
fn the_shell_splitter_reads_the_quoting_the_page_uses() {
    assert_eq!(
        shell_words(r#"printf '"c"\n' | curl -s -H 'a: b' -d '{"x": 1}'"#),
        vec![
            "printf",
            r#""c"\n"#,
            "|",
            "curl",
            "-s",
            "-H",
            "a: b",
            "-d",
            r#"{"x": 1}"#
        ]
    );
}
