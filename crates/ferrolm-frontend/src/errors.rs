//! HTTP errors in OpenAI's envelope: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), param: None, code: None }
    }

    /// A 400 naming the field at fault.
    pub fn bad_request(message: impl Into<String>, param: impl Into<String>) -> Self {
        ApiError { status: 400, message: message.into(), param: Some(param.into()), code: None }
    }

    pub fn with_code(mut self, code: &str) -> Self {
        self.code = Some(code.to_string());
        self
    }

    pub fn with_param(mut self, param: Option<String>) -> Self {
        self.param = param;
        self
    }

    pub fn envelope(&self) -> Value {
        let kind = match self.status {
            401 => "authentication_error",
            429 => "rate_limit_error",
            500 => "server_error",
            503 => "service_unavailable_error",
            _ => "invalid_request_error",
        };
        let code = match &self.code {
            Some(c) => Value::from(c.as_str()),
            None => Value::from(self.status),
        };
        json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self.envelope()).expect("an envelope serializes");
        let mut r = (status, body).into_response();
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if self.status == 401 {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
