//! The error body of every refused request: `{"error": ..., "field": ...}`
//! and its HTTP status. A leaf: the body types and their checks use it.

use serde::Serialize;

/// An error answer: `{"error": "...", "field": "cpus.topology"}`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    #[serde(skip)]
    pub status: u16,
    /// What is wrong and what to give instead.
    pub error: String,
    /// The request field at fault, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ApiError {
    /// A 400 naming `field`.
    pub fn bad(field: &str, error: impl Into<String>) -> Self {
        Self {
            status: 400,
            error: format!("{field}: {}", error.into()),
            field: Some(field.into()),
        }
    }
    /// Any status, no field.
    pub fn status(status: u16, error: impl Into<String>) -> Self {
        Self {
            status,
            error: error.into(),
            field: None,
        }
    }
    /// A body that is not valid JSON for the expected type. serde names an
    /// unknown or missing field in its message; that name becomes `field`.
    pub fn from_json(e: &serde_json::Error) -> Self {
        let msg = e.to_string();
        let field = ["unknown field `", "missing field `"].iter().find_map(|p| {
            let i = msg.find(p)? + p.len();
            let j = msg[i..].find('`')? + i;
            Some(msg[i..j].to_string())
        });
        Self {
            status: 400,
            error: format!("invalid JSON body: {msg}"),
            field,
        }
    }
}
