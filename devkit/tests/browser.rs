//! The browser plumbing against real chromedriver and Chromium: pages served with a
//! Content-Security-Policy that, like the console's, allows no inline script, a form filled in and
//! submitted, and axe-core telling an
//! accessible page from one that is not. Needs what `cargo xtask test` installs and names.

#![allow(clippy::unwrap_used)]

use fantoccini::Locator;
use oncepay_devkit::browser::{Browser, axe};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A policy that, like the console's, allows no inline script.
const POLICY: &str = "default-src 'self'; script-src 'self'";

/// Labelled fields, a heading and a language; the inline script must not run.
const GOOD: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Good page</title></head>
<body><main>
<h1 id="heading">Resend a payment</h1>
<script>document.title = 'The inline script ran';</script>
<form method="post" action="/sent">
<label for="name">Name</label> <input id="name" name="name" type="text">
<button type="submit">Send</button>
</form>
</main></body>
</html>"#;

/// An image without alternative text and a field without a label.
const BAD: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Bad page</title></head>
<body><main>
<h1>Resend a payment</h1>
<img src="/logo.png">
<form method="post" action="/sent"><input name="name" type="text"><button type="submit">Send</button></form>
</main></body>
</html>"#;

/// Serves the pages on a loopback port and returns their address.
async fn serve() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(respond(stream));
        }
    });
    address
}

/// Responds to one request, then closes the connection.
async fn respond(mut stream: TcpStream) {
    let mut request = Vec::new();
    let mut buffer = [0; 4096];
    // The head, then as much body as it announces.
    let (head, body) = loop {
        let Ok(read @ 1..) = stream.read(&mut buffer).await else { return };
        request.extend_from_slice(&buffer[..read]);
        let Some(end) = request.windows(4).position(|window| window == b"\r\n\r\n") else { continue };
        let head = String::from_utf8_lossy(&request[..end]).into_owned();
        let length = head
            .lines()
            .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|n| n.trim().to_owned()))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
        if request.len() >= end + 4 + length {
            break (head, request[end + 4..end + 4 + length].to_vec());
        }
    };
    let (status, page) = match head.split(' ').take(2).collect::<Vec<_>>()[..] {
        ["GET", "/good"] => ("200 OK", GOOD.to_owned()),
        ["GET", "/bad"] => ("200 OK", BAD.to_owned()),
        ["POST", "/sent"] => {
            let form: Vec<(String, String)> = serde_urlencoded::from_bytes(&body).unwrap();
            let name = form.iter().find(|(key, _)| key == "name").map_or("", |(_, value)| value);
            let sent = format!(
                "<!doctype html><html lang=\"en\"><head><title>Sent</title></head><body><main>\
                 <p id=\"sent\">Sent for {name}</p></main></body></html>"
            );
            ("200 OK", sent)
        }
        _ => ("404 Not Found", String::new()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Security-Policy: {POLICY}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{page}",
        page.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
}

#[tokio::test]
async fn drives_headless_chromium_and_runs_axe_core_under_a_strict_policy() {
    let site = serve().await;
    let logs = tempfile::tempdir().unwrap();
    let browser = Browser::start(logs.path()).await.unwrap();
    let session = browser.session().await.unwrap();

    session.goto(&format!("{site}/good")).await.unwrap();
    assert_eq!(session.title().await.unwrap(), "Good page", "the policy lets no inline script run");
    assert_eq!(session.find(Locator::Id("heading")).await.unwrap().text().await.unwrap(), "Resend a payment");
    let violations = axe(&session).await.unwrap();
    assert!(violations.is_empty(), "violations on the good page: {violations:#?}");

    let form = session.form(Locator::Css("form")).await.unwrap();
    form.set_by_name("name", "Ada").await.unwrap().submit().await.unwrap();
    let sent = session.wait().for_element(Locator::Id("sent")).await.unwrap();
    assert_eq!(sent.text().await.unwrap(), "Sent for Ada");
    assert_eq!(session.current_url().await.unwrap().path(), "/sent");

    session.goto(&format!("{site}/bad")).await.unwrap();
    let violations = axe(&session).await.unwrap();
    let rules: Vec<&str> = violations.iter().map(|violation| violation.id.as_str()).collect();
    assert!(rules.contains(&"image-alt") && rules.contains(&"label"), "violations on the bad page: {violations:#?}");
    let image = violations.iter().find(|violation| violation.id == "image-alt").unwrap();
    assert_eq!(image.to_string(), "image-alt (critical): Images must have alternative text, at img");

    session.close().await.unwrap();
    browser.stop().await.unwrap();
}
