//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the
//! HTTP status they travel with. Every error the HTTP side answers is built here, so no
//! route answers a bare status or a non-JSON body.

use actix_web::{http::StatusCode, HttpResponse};
use serde::Serialize;

/// One error answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Detail<'a>,
}

#[derive(Serialize)]
struct Detail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// A 400 about one parameter (its name in `param` and in the message).
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            message.into(),
        )
        .param(param)
        .code("invalid_value")
    }

    /// A 400 for a parameter this server does not honour.
    pub fn unsupported(param: &str, why: &str) -> Self {
        Self::invalid(param, format!("{param} is not supported: {why}"))
            .code("unsupported_parameter")
    }

    /// A 400 for a key the endpoint does not know.
    pub fn unknown(param: &str) -> Self {
        Self::invalid(param, format!("unrecognized request argument: {param}"))
            .code("unknown_parameter")
    }

    /// A 400 without a parameter (a body that is not a JSON object, ...).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// A 404 for a model this server does not serve.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model `{model}` does not exist"),
        )
        .param("model")
        .code("model_not_found")
    }

    /// A 503: the engine cannot take or finish the request (`code` says why).
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).code(code)
    }

    pub fn param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The JSON document (also an SSE error event's data).
    pub fn body(&self) -> serde_json::Value {
        serde_json::to_value(Body {
            error: Detail {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        })
        .unwrap_or_default()
    }

    pub fn response(&self) -> HttpResponse {
        HttpResponse::build(self.status).json(self.body())
    }
}

impl From<ApiError> for HttpResponse {
    fn from(e: ApiError) -> Self {
        e.response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_has_all_four_fields() {
        let v = ApiError::unsupported("suffix", "no insertion").body();
        assert_eq!(v["error"]["param"], "suffix");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "unsupported_parameter");
        assert!(v["error"]["message"].as_str().unwrap().contains("suffix"));
        let v = ApiError::bad_request("x").body();
        assert!(v["error"]["param"].is_null() && v["error"]["code"].is_null());
    }
}
