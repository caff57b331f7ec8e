//! Headless Chromium driven over the DevTools protocol (a WebSocket), for the browser test:
//! open a page, evaluate script in it, take screenshots, and collect every console error.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tungstenite::{Message, WebSocket};

/// How long one protocol call may take.
const CALL_DEADLINE: Duration = Duration::from_secs(30);

/// A headless Chromium this test started, with one page attached.
#[derive(Debug)]
pub(crate) struct Browser {
    child: Process,
    socket: WebSocket<TcpStream>,
    session: String,
    next_id: u64,
    /// Console errors, uncaught exceptions and failed loads seen so far.
    pub(crate) errors: Vec<String>,
}

impl Browser {
    /// Starts `chromium` headless (flags that work as root in a container) with its profile in
    /// `profile`, and opens a blank page of `width`×`height`.
    pub(crate) fn launch(
        chromium: &Path,
        profile: &Path,
        width: u32,
        height: u32,
    ) -> Result<Self, String> {
        let child = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-port=0",
                "--remote-allow-origins=*",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--window-size={width},{height}"))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", chromium.display()))?;
        // From here on, any early return ends the browser.
        let mut child = Process(child);
        let stderr = child.0.stderr.take().ok_or("no stderr")?;
        let (tx, rx) = mpsc::channel();
        // Drains stderr for the browser's whole life (a full pipe would stall it).
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("ws://") {
                    let _ = tx.send(line[at..].trim().to_owned());
                }
            }
        });
        let endpoint = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(url) => url,
            Err(_) => return Err("chromium announced no DevTools endpoint within 60 s".into()),
        };
        let host = endpoint
            .strip_prefix("ws://")
            .and_then(|r| r.split('/').next())
            .ok_or(format!("odd endpoint {endpoint}"))?
            .to_owned();
        let stream = TcpStream::connect(&host).map_err(|e| format!("{host}: {e}"))?;
        // The handshake reads with a long deadline; calls then poll in short reads.
        stream.set_read_timeout(Some(CALL_DEADLINE)).map_err(|e| e.to_string())?;
        let (socket, _) =
            tungstenite::client(endpoint.as_str(), stream).map_err(|e| format!("{e}"))?;
        socket
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(500)))
            .map_err(|e| e.to_string())?;
        let mut browser =
            Self { child, socket, session: String::new(), next_id: 0, errors: Vec::new() };
        let target = browser.call("Target.createTarget", json!({ "url": "about:blank" }))?;
        let target_id = target["targetId"].as_str().ok_or("no targetId")?.to_owned();
        let attached = browser
            .call("Target.attachToTarget", json!({ "targetId": target_id, "flatten": true }))?;
        browser.session = attached["sessionId"].as_str().ok_or("no sessionId")?.to_owned();
        for domain in ["Runtime.enable", "Log.enable", "Page.enable"] {
            browser.call(domain, json!({}))?;
        }
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        )?;
        Ok(browser)
    }

    /// Sends a command (to the page once attached) and waits for its result, noting every
    /// error event that arrives meanwhile.
    pub(crate) fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            message["sessionId"] = Value::from(self.session.clone());
        }
        self.socket
            .send(Message::text(message.to_string()))
            .map_err(|e| format!("{method}: {e}"))?;
        let deadline = Instant::now() + CALL_DEADLINE;
        loop {
            if Instant::now() > deadline {
                return Err(format!("{method}: no answer within {CALL_DEADLINE:?}"));
            }
            let text = match self.socket.read() {
                Ok(Message::Text(t)) => t.to_string(),
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue;
                }
                Err(e) => return Err(format!("{method}: {e}")),
            };
            let value: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            if value["id"].as_u64() == Some(id) {
                if let Some(error) = value.get("error") {
                    return Err(format!("{method}: {error}"));
                }
                return Ok(value["result"].clone());
            }
            self.note(&value);
        }
    }

    /// Keeps the errors among the page's events.
    fn note(&mut self, event: &Value) {
        let params = &event["params"];
        match event["method"].as_str() {
            Some("Runtime.exceptionThrown") => {
                self.errors.push(format!("exception: {}", params["exceptionDetails"]))
            }
            Some("Runtime.consoleAPICalled")
                if matches!(params["type"].as_str(), Some("error" | "assert")) =>
            {
                self.errors.push(format!("console.{}: {}", params["type"], params["args"]))
            }
            Some("Log.entryAdded") if params["entry"]["level"] == "error" => {
                self.errors.push(format!("log: {}", params["entry"]))
            }
            _ => {}
        }
    }

    /// Opens `url` in the page.
    pub(crate) fn navigate(&mut self, url: &str) -> Result<(), String> {
        let result = self.call("Page.navigate", json!({ "url": url }))?;
        match result.get("errorText") {
            Some(e) => Err(format!("navigating to {url}: {e}")),
            None => Ok(()),
        }
    }

    /// The value of a script expression evaluated in the page.
    pub(crate) fn eval(&mut self, expression: &str) -> Result<Value, String> {
        let result = self
            .call("Runtime.evaluate", json!({ "expression": expression, "returnByValue": true }))?;
        if let Some(e) = result.get("exceptionDetails") {
            return Err(format!("{expression}: {e}"));
        }
        Ok(result["result"]["value"].clone())
    }

    /// A PNG of the page as shown.
    pub(crate) fn screenshot(&mut self) -> Result<Vec<u8>, String> {
        let result = self.call("Page.captureScreenshot", json!({ "format": "png" }))?;
        let data = result["data"].as_str().ok_or("no screenshot data")?;
        data_encoding::BASE64.decode(data.as_bytes()).map_err(|e| e.to_string())
    }

    /// Closes the browser: asks it to quit (so it takes its helper processes along), and
    /// kills it if it has not exited within 10 s.
    pub(crate) fn close(mut self) {
        self.quit();
    }

    fn quit(&mut self) {
        self.session.clear();
        let id = self.next_id + 1;
        self.next_id = id;
        let message = json!({ "id": id, "method": "Browser.close", "params": {} });
        let _ = self.socket.send(Message::text(message.to_string()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // A failed test still closes its browser; `Process` kills it if that did not work.
        self.quit();
    }
}

/// A process this test started, killed (by its own handle) when dropped.
#[derive(Debug)]
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
