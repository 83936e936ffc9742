//! Chat templates: tokenizer_config.json's Jinja `chat_template`, rendered with minijinja.

use std::path::{Path, PathBuf};

use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;
use serde_json::Value;

use crate::error::{read_json, TransformerError};

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// A checkpoint's chat template and the special token strings it may refer to.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    source: String,
    path: PathBuf,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

/// A special token field: a string, or an object with `content` (tokenizer_config.json's forms).
pub(crate) fn special_token(
    path: &Path,
    config: &Value,
    field: &str,
) -> Result<Option<String>, TransformerError> {
    match config.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(TransformerError::Field {
                path: path.to_path_buf(),
                field: format!("{field}.content"),
                problem: "missing or not a string".into(),
            }),
        },
        Some(other) => Err(TransformerError::Field {
            path: path.to_path_buf(),
            field: field.into(),
            problem: format!("expected a string or an object with content, found {other}"),
        }),
    }
}

impl ChatTemplate {
    /// Read `dir/tokenizer_config.json`'s chat_template: a string, or a list of
    /// `{name, template}` from which "default" is taken.
    pub fn from_dir(dir: &Path) -> Result<Self, TransformerError> {
        let path = dir.join("tokenizer_config.json");
        let value = read_json(&path)?;
        let field_err = |field: &str, problem: String| TransformerError::Field {
            path: path.clone(),
            field: field.into(),
            problem,
        };
        let source = match value.get("chat_template") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(list)) => {
                let mut names = Vec::new();
                let mut found = None;
                for item in list {
                    let name = item.get("name").and_then(Value::as_str);
                    let template = item.get("template").and_then(Value::as_str);
                    match (name, template) {
                        (Some(n), Some(t)) => {
                            if n == "default" {
                                found = Some(t.to_string());
                            }
                            names.push(n.to_string());
                        }
                        _ => {
                            return Err(field_err(
                                "chat_template",
                                format!("list entry {item} lacks a string name or template"),
                            ))
                        }
                    }
                }
                found.ok_or_else(|| {
                    field_err(
                        "chat_template",
                        format!("the list has no \"default\" template (names: {names:?})"),
                    )
                })?
            }
            None | Some(Value::Null) => {
                return Err(field_err("chat_template", "missing".into()));
            }
            Some(other) => {
                return Err(field_err(
                    "chat_template",
                    format!("expected a string or a list of {{name, template}}, found {other}"),
                ))
            }
        };
        let template = Self {
            bos_token: special_token(&path, &value, "bos_token")?,
            eos_token: special_token(&path, &value, "eos_token")?,
            source,
            path,
        };
        // Parse once now, so a broken template fails at load, not at the first request.
        template
            .environment()
            .template_from_str(&template.source)
            .map_err(|e| template.err(&e))?;
        Ok(template)
    }

    fn err(&self, e: &Error) -> TransformerError {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            message.push_str(&format!(": {s}"));
            source = s.source();
        }
        TransformerError::Template {
            path: self.path.clone(),
            message,
        }
    }

    /// A Jinja environment as Hugging Face renders chat templates: trim_blocks and
    /// lstrip_blocks on, Python string methods, and `raise_exception`.
    fn environment<'s>(&self) -> Environment<'s> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env
    }

    /// Render the conversation; `add_generation_prompt` opens the assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TransformerError> {
        let env = self.environment();
        let template = env
            .template_from_str(&self.source)
            .map_err(|e| self.err(&e))?;
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.clone().unwrap_or_default(),
                eos_token => self.eos_token.clone().unwrap_or_default(),
            })
            .map_err(|e| self.err(&e))
    }
}
