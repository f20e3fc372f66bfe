//! Shared by the browser tests: headless Chromium driven over WebDriver
//! (`chromedriver` and the `fantoccini` crate), and where their screenshots
//! go.
//!
//! Needs Debian's `chromium` and `chromium-driver`. When `chromedriver` is
//! missing and the test runs as root it installs them with apt-get (as CI
//! does); otherwise it fails and says what to install: never a silent skip.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use serde_json::json;

use crate::support::DEADLINE;

pub struct Driver {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

fn ensure_chromium() {
    if have("chromedriver") && have("chromium") {
        return;
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n");
    assert!(
        root.unwrap_or(false),
        "this test needs Debian's chromium and chromium-driver: apt-get install -y chromium chromium-driver"
    );
    for args in [
        vec!["update", "-qq"],
        vec!["install", "-y", "-qq", "chromium", "chromium-driver"],
    ] {
        let status = Command::new("apt-get")
            .args(&args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .expect("apt-get runs");
        assert!(status.success(), "apt-get {args:?} failed");
    }
}

pub async fn start_driver() -> Driver {
    ensure_chromium();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(started.elapsed() < DEADLINE, "chromedriver never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Driver {
        child,
        port,
        _profile: tempfile::tempdir().unwrap(),
    }
}

/// A WebDriver session on headless Chromium.
pub async fn browser(driver: &Driver) -> Client {
    browser_with(driver, &[]).await
}

/// A WebDriver session on headless Chromium with `extra` flags.
pub async fn browser_with(driver: &Driver, extra: &[&str]) -> Client {
    let profile = driver._profile.path().display().to_string();
    let mut args: Vec<String> = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--window-size=1280,1200",
        "--hide-scrollbars",
    ]
    .iter()
    .chain(extra)
    .map(|arg| arg.to_string())
    .collect();
    args.push(format!("--user-data-dir={profile}"));
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({ "binary": "/usr/bin/chromium", "args": args }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a WebDriver session")
}

/// Saves a PNG of what the page shows as `target/console-screenshots/NAME`
/// and returns its path.
pub async fn screenshot(client: &Client, name: &str) -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = workspace
        .parent()
        .expect("node/ is in the workspace")
        .join("target/console-screenshots");
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    let png = client.screenshot().await.expect("a screenshot");
    let path = dir.join(name);
    std::fs::write(&path, png).expect("the screenshot is written");
    path
}
