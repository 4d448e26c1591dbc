//! A headless Chromium driven over the DevTools protocol on a pipe
//! (`--remote-debugging-pipe`: NUL-separated JSON on fds 3 and 4, which a
//! shell maps from the child's stdin and stdout), so the tests need no
//! WebSocket client. Missing Chromium: skipped locally, a failure under `CI=true`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Longest any one protocol call or wait may take (a bound, never asserted on).
const PATIENCE: Duration = Duration::from_secs(60);

pub struct Browser {
    child: Child,
    stdin: ChildStdin,
    rx: mpsc::Receiver<Value>,
    next_id: u64,
    session: Option<String>,
    _profile: tempfile::TempDir,
}

fn find_chromium() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

impl Browser {
    /// A fresh browser with an empty profile, or `None` (with a message) when
    /// Chromium is not installed and this is not CI.
    pub fn launch() -> Option<Browser> {
        let Some(bin) = find_chromium() else {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!(
                    "chromium is not installed (CI installs Debian's chromium package in .ci/run)"
                );
            }
            eprintln!(
                "skipping: chromium not found on PATH (apt-get install chromium, or set CHROMIUM)"
            );
            return None;
        };
        let profile = tempfile::tempdir().expect("temporary profile directory");
        let log = std::fs::File::create(profile.path().join("chromium.log")).expect("log file");
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>&2"#)
            .arg(&bin)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut buf = Vec::new();
            while let Ok(n) = r.read_until(0, &mut buf) {
                if n == 0 {
                    return;
                }
                if buf.last() == Some(&0) {
                    buf.pop();
                }
                if let Ok(v) = serde_json::from_slice::<Value>(&buf)
                    && tx.send(v).is_err()
                {
                    return;
                }
                buf.clear();
            }
        });
        Some(Browser {
            child,
            stdin,
            rx,
            next_id: 0,
            session: None,
            _profile: profile,
        })
    }

    /// Sends one command (to the page's session once one is attached) and waits for its answer.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = &self.session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).expect("json");
        bytes.push(0);
        self.stdin.write_all(&bytes).expect("writing to chromium");
        self.stdin.flush().expect("writing to chromium");
        let until = Instant::now() + PATIENCE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let v = self
                .rx
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("{method}: no answer from chromium ({e})"));
            if v["id"] == json!(id) {
                if let Some(err) = v.get("error") {
                    panic!("{method}: {err}");
                }
                return v["result"].clone();
            }
        }
    }

    /// Opens `url` in a new page of `width` × `height` CSS pixels.
    pub fn open(&mut self, url: &str, width: u32, height: u32) {
        let target = self.call("Target.createTarget", json!({"url": "about:blank"}));
        let attached = self.call(
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        self.session = attached["sessionId"].as_str().map(str::to_string);
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        );
        self.call("Page.enable", json!({}));
        self.call("Page.navigate", json!({"url": url}));
    }

    /// The value of a JavaScript expression in the page (promises awaited).
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expr}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Polls `expr` until it is truthy; panics naming `what` when it never is.
    pub fn wait_for(&mut self, expr: &str, what: &str) -> Value {
        let until = Instant::now() + PATIENCE;
        loop {
            let v = self.eval(expr);
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return v;
            }
            if Instant::now() > until {
                panic!("timed out waiting for {what} ({expr} = {v})");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A PNG of the whole page (beyond the viewport).
    pub fn screenshot(&mut self, path: &Path) {
        use base64::Engine;
        let r = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        let data = r["data"].as_str().expect("screenshot data");
        let png = base64::engine::general_purpose::STANDARD
            .decode(data)
            .expect("base64 screenshot");
        std::fs::write(path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
