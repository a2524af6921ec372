//! The HTTP/1 server: accepts connections, serves each with hyper, and carries out the
//! connection-level fault (closing a connection with no response at all).
//!
//! On shutdown the listener closes first, every connection is told to finish its current request
//! and close (HTTP/1 graceful shutdown), and the server waits for connections and detached charge
//! work up to the grace period, then returns regardless.

use std::convert::Infallible;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::routes::{self, App, Reply};

/// Serves `listener` until `app.shutdown`, then drains for at most `grace`.
pub async fn serve(listener: TcpListener, app: Arc<App>, grace: Duration) {
    let connections = TaskTracker::new();
    loop {
        tokio::select! {
            () = app.shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    connections.spawn(serve_connection(stream, app.clone()));
                }
                Err(error) => {
                    // Usually out of file descriptors: back off a little instead of spinning.
                    tracing::warn!(error = %error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    connections.close();
    app.work.close();
    let drained = async {
        connections.wait().await;
        app.work.wait().await;
    };
    if tokio::time::timeout(grace, drained).await.is_err() {
        tracing::warn!(grace_ms = grace.as_millis(), "requests still in flight after the grace period are abandoned");
    }
}

/// Serves one connection with hyper, not actix-web: the drop-after fault needs a request to end
/// with the TCP connection closed before a single byte of a response is written. actix-web always
/// writes a response for a handler (even an error becomes a 500) and gives a handler no handle on
/// its connection. Here this task owns the connection's future, so dropping the connection is
/// dropping that future: the handler asks for it ([`Reply::DropConnection`]), and the task stops
/// polling and drops the socket.
async fn serve_connection(stream: TcpStream, app: Arc<App>) {
    let abort = CancellationToken::new();
    let service = {
        let (app, abort) = (app.clone(), abort.clone());
        service_fn(move |request| {
            let (app, abort) = (app.clone(), abort.clone());
            async move {
                match routes::handle(app, request).await {
                    Reply::Respond(response) => Ok::<_, Infallible>(response),
                    Reply::DropConnection => {
                        abort.cancel();
                        // The connection task drops this future along with the connection.
                        std::future::pending().await
                    }
                }
            }
        })
    };
    let connection = http1::Builder::new().timer(TokioTimer::new()).serve_connection(TokioIo::new(stream), service);
    let mut connection = pin!(connection);
    let mut draining = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(error = %error, "connection ended with an error");
                }
                return;
            }
            // Returning drops the connection and its socket: the client gets no response.
            () = abort.cancelled() => return,
            () = app.shutdown.cancelled(), if !draining => {
                connection.as_mut().graceful_shutdown();
                draining = true;
            }
        }
    }
}
