//! Tokenizer: an HF `tokenizer.json` (via the `tokenizers` crate), plus what
//! Jet needs from the `tokenizer_config.json` next to it (chat template,
//! bos/eos tokens).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::model::ModelError;

pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// Newer HF exports keep the chat template in its own file.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// A loaded tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Where it came from, for error messages.
    source: PathBuf,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("source", &self.source)
            .field("vocab_size", &self.vocab_size())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

/// The parts of `tokenizer_config.json` Jet reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenizerConfig {
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
}

impl Tokenizer {
    /// Loads `path` (a `tokenizer.json`) and, when present next to it,
    /// `tokenizer_config.json` and `chat_template.jinja`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer, ModelError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
        let mut tok = Self::from_bytes_at(&bytes, path)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        if config_path.exists() {
            let cfg = TokenizerConfig::from_file(&config_path)?;
            tok.chat_template = cfg.chat_template;
            tok.bos_token = cfg.bos_token;
            tok.eos_token = cfg.eos_token;
        }
        let template_path = dir.join(CHAT_TEMPLATE_FILE);
        if tok.chat_template.is_none() && template_path.exists() {
            let text = std::fs::read_to_string(&template_path)
                .map_err(|e| ModelError::io(&template_path, e))?;
            tok.chat_template = Some(text);
        }
        Ok(tok)
    }

    /// Loads `dir/tokenizer.json` (and its companions, see [`Tokenizer::from_file`]).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Tokenizer, ModelError> {
        Self::from_file(dir.as_ref().join(TOKENIZER_FILE))
    }

    /// A tokenizer from the text of a `tokenizer.json` (no tokenizer config).
    pub fn from_json_str(json: &str) -> Result<Tokenizer, ModelError> {
        Self::from_bytes(json.as_bytes())
    }

    /// A tokenizer from the bytes of a `tokenizer.json` (no tokenizer config).
    pub fn from_bytes(bytes: &[u8]) -> Result<Tokenizer, ModelError> {
        Self::from_bytes_at(bytes, Path::new("<in-memory tokenizer.json>"))
    }

    fn from_bytes_at(bytes: &[u8], source: &Path) -> Result<Tokenizer, ModelError> {
        let inner =
            tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| ModelError::Tokenizer {
                path: source.to_path_buf(),
                reason: format!("cannot load: {e}"),
            })?;
        Ok(Tokenizer {
            inner,
            source: source.to_path_buf(),
            chat_template: None,
            bos_token: None,
            eos_token: None,
        })
    }

    /// Sets what a `tokenizer_config.json` would (for tokenizers built in memory).
    pub fn with_config(mut self, cfg: TokenizerConfig) -> Tokenizer {
        self.chat_template = cfg.chat_template;
        self.bos_token = cfg.bos_token;
        self.eos_token = cfg.eos_token;
        self
    }

    fn err(&self, what: &str, e: tokenizers::Error) -> ModelError {
        ModelError::Tokenizer {
            path: self.source.clone(),
            reason: format!("{what}: {e}"),
        }
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| self.err("encode", e))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, ModelError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| self.err("decode", e))
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The Jinja chat template, unrendered.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token.as_deref().and_then(|t| self.token_to_id(t))
    }

    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token.as_deref().and_then(|t| self.token_to_id(t))
    }

    /// The file it was loaded from (or a placeholder for in-memory ones).
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

impl TokenizerConfig {
    pub fn from_file(path: impl AsRef<Path>) -> Result<TokenizerConfig, ModelError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|source| ModelError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_value(&v, path)
    }

    /// `path` names the source in errors.
    pub fn from_json_value(v: &Value, path: &Path) -> Result<TokenizerConfig, ModelError> {
        let wrong = |field: &str, expected: &'static str, found: &Value| ModelError::WrongType {
            path: path.to_path_buf(),
            field: field.into(),
            expected,
            found: crate::model::json::describe(found),
        };
        let Value::Object(obj) = v else {
            return Err(wrong("(top level)", "an object", v));
        };
        // A token is a string or an AddedToken object {"content": ...}.
        let token = |field: &str| -> Result<Option<String>, ModelError> {
            match obj.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(t @ Value::Object(o)) => match o.get("content") {
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    _ => Err(wrong(field, "a string or {\"content\": string}", t)),
                },
                Some(t) => Err(wrong(field, "a string or {\"content\": string}", t)),
            }
        };
        // A template is a string, or a list of {"name", "template"} (the one
        // named "default" is used, else the first).
        let chat_template = match obj.get("chat_template") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(t @ Value::Array(items)) => {
                let expected = "a string or a list of {\"name\", \"template\"}";
                let mut named = Vec::with_capacity(items.len());
                for item in items {
                    let name = item.get("name").and_then(Value::as_str);
                    let Some(template) = item.get("template").and_then(Value::as_str) else {
                        return Err(wrong("chat_template", expected, t));
                    };
                    named.push((name, template));
                }
                named
                    .iter()
                    .find(|(n, _)| *n == Some("default"))
                    .or(named.first())
                    .map(|(_, t)| t.to_string())
            }
            Some(t) => {
                return Err(wrong(
                    "chat_template",
                    "a string or a list of {\"name\", \"template\"}",
                    t,
                ))
            }
        };
        Ok(TokenizerConfig {
            chat_template,
            bos_token: token("bos_token")?,
            eos_token: token("eos_token")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3-tiny")
    }

    #[test]
    fn matches_hf_ids() {
        let tok = Tokenizer::from_dir(fixture_dir()).unwrap();
        let check: Value = serde_json::from_slice(
            &std::fs::read(fixture_dir().join("tokenizer_check.json")).unwrap(),
        )
        .unwrap();
        for case in check.as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = case["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(tok.encode(text, true).unwrap(), want, "{text}");
            assert_eq!(tok.decode(&want, false).unwrap(), text);
        }
        assert_eq!(tok.vocab_size(), 320);
        assert_eq!(tok.eos_token(), Some("<|endoftext|>"));
        assert_eq!(tok.bos_token(), Some("<|endoftext|>"));
        assert_eq!(tok.eos_token_id(), Some(0));
        assert_eq!(tok.token_to_id("<|im_end|>"), Some(2));
        assert_eq!(tok.id_to_token(2).as_deref(), Some("<|im_end|>"));
        assert_eq!(tok.chat_template(), None);
    }

    #[test]
    fn special_tokens() {
        let tok = Tokenizer::from_dir(fixture_dir()).unwrap();
        let ids = tok.encode("<|im_start|>12+34=<|im_end|>", false).unwrap();
        assert_eq!(ids.first(), Some(&1));
        assert_eq!(ids.last(), Some(&2));
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            "<|im_start|>12+34=<|im_end|>"
        );
        assert_eq!(tok.decode(&ids, true).unwrap(), "12+34=");
    }

    #[test]
    fn tokenizer_config_variants() {
        let json = std::fs::read_to_string(fixture_dir().join(TOKENIZER_FILE)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TOKENIZER_FILE);
        std::fs::write(&path, &json).unwrap();
        // Token objects and a template list.
        let cfg = serde_json::json!({
            "bos_token": {"__type": "AddedToken", "content": "<|im_start|>", "lstrip": false},
            "eos_token": "<|im_end|>",
            "chat_template": [
                {"name": "tool_use", "template": "T"},
                {"name": "default", "template": "{{ messages }}"}
            ]
        });
        std::fs::write(dir.path().join(TOKENIZER_CONFIG_FILE), cfg.to_string()).unwrap();
        let tok = Tokenizer::from_file(&path).unwrap();
        assert_eq!(tok.bos_token_id(), Some(1));
        assert_eq!(tok.eos_token_id(), Some(2));
        assert_eq!(tok.chat_template(), Some("{{ messages }}"));
        // A separate chat_template.jinja is used when the config has none.
        std::fs::write(
            dir.path().join(TOKENIZER_CONFIG_FILE),
            "{\"eos_token\": null}",
        )
        .unwrap();
        std::fs::write(dir.path().join(CHAT_TEMPLATE_FILE), "J").unwrap();
        let tok = Tokenizer::from_file(&path).unwrap();
        assert_eq!(tok.chat_template(), Some("J"));
        assert_eq!(tok.eos_token(), None);
        // Bad config: the message names the file and field.
        std::fs::write(dir.path().join(TOKENIZER_CONFIG_FILE), "{\"eos_token\": 5}").unwrap();
        let msg = Tokenizer::from_file(&path).unwrap_err().to_string();
        assert!(
            msg.contains(TOKENIZER_CONFIG_FILE) && msg.contains("eos_token"),
            "{msg}"
        );
        std::fs::write(dir.path().join(TOKENIZER_CONFIG_FILE), "{").unwrap();
        let msg = Tokenizer::from_file(&path).unwrap_err().to_string();
        assert!(
            msg.contains(TOKENIZER_CONFIG_FILE) && msg.contains("invalid JSON"),
            "{msg}"
        );
        // In memory.
        let tok = Tokenizer::from_json_str(&json)
            .unwrap()
            .with_config(TokenizerConfig {
                eos_token: Some("<|im_end|>".into()),
                ..TokenizerConfig::default()
            });
        assert_eq!(tok.eos_token_id(), Some(2));
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(TOKENIZER_FILE);
        let msg = Tokenizer::from_file(&path).unwrap_err().to_string();
        assert!(
            msg.contains("tokenizer.json") && msg.contains("not found"),
            "{msg}"
        );
        std::fs::write(&path, "{\"model\": 3}").unwrap();
        let msg = Tokenizer::from_file(&path).unwrap_err().to_string();
        assert!(
            msg.contains("tokenizer.json") && msg.contains("cannot load"),
            "{msg}"
        );
        let msg = Tokenizer::from_json_str("nope").unwrap_err().to_string();
        assert!(msg.contains("<in-memory tokenizer.json>"), "{msg}");
    }
}
