//! The port while the model loads: bound at once, so that a probe sees the server starting
//! (`/health` 503, "the engine is starting") rather than
//! a refused connection; handed over to [`crate::Frontend`] once the engine is built.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::json;
use tokio::sync::oneshot;

use crate::errors::ApiError;
use crate::http::json_response;

pub const STARTING: &str = "the engine is starting";

/// Answers 503 on every route until [`Loading::into_listener`] hands the socket over.
pub struct Loading {
    listener: Option<std::net::TcpListener>,
    local_addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Loading {
    pub fn bind(host: &str, port: u16) -> Result<Self, String> {
        let addr = format!("{host}:{port}");
        let listener =
            std::net::TcpListener::bind(&addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let local_addr = listener.local_addr().map_err(|e| e.to_string())?;
        // the same socket, served here until the front end takes the other handle
        let serving = listener.try_clone().map_err(|e| e.to_string())?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ferrolm-loading")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| format!("the HTTP runtime could not start: {e}"))?;
        let (tx, rx) = oneshot::channel::<()>();
        runtime.spawn(async move {
            let listener = match tokio::net::TcpListener::from_std(serving) {
                Ok(l) => l,
                Err(e) => return tracing::error!("the loading server could not start: {e}"),
            };
            let app = Router::new().fallback(starting);
            let serve = axum::serve(listener, app).with_graceful_shutdown(async {
                let _ = rx.await;
            });
            if let Err(e) = serve.await {
                tracing::error!("the loading server stopped: {e}");
            }
        });
        Ok(Loading { listener: Some(listener), local_addr, runtime: Some(runtime), shutdown: Some(tx) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops answering and hands the bound socket over (connections it held are closed).
    pub fn into_listener(mut self) -> std::net::TcpListener {
        self.stop();
        self.listener.take().expect("held until handed over")
    }

    fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_millis(500));
        }
    }
}

impl Drop for Loading {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn starting(request: Request) -> Response {
    if request.uri().path() == "/health" {
        let mut r = json_response(&json!({"status": "unavailable", "reason": STARTING}));
        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        return r;
    }
    ApiError::new(503, format!("the engine is unavailable: {STARTING}"))
        .with_code("engine_unavailable")
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn answers_503_until_the_socket_is_handed_over() {
        let loading = Loading::bind("127.0.0.1", 0).unwrap();
        let addr = loading.local_addr();
        let health = get(addr, "/health");
        assert!(health.starts_with("HTTP/1.1 503"), "{health}");
        assert!(health.contains(STARTING), "{health}");
        let other = get(addr, "/v1/models");
        assert!(other.starts_with("HTTP/1.1 503") && other.contains("engine_unavailable"), "{other}");
        let listener = loading.into_listener();
        assert_eq!(listener.local_addr().unwrap(), addr); // still bound: nobody else can take it
    }
}
