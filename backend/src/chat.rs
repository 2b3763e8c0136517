//! Chat templates: a tokenizer_config.json's Jinja `chat_template`, rendered
//! for a single user turn with the generation prompt (what HF's
//! `apply_chat_template(..., add_generation_prompt=True)` gives).

use std::path::Path;

use minijinja::{context, Environment, Error, ErrorKind};

use crate::tokenizer::Tokenizer;

/// End-of-text tokens recognised when no tokenizer_config.json names the EOS.
const CONVENTIONAL_EOS: [&str; 4] = ["<|endoftext|>", "<|im_end|>", "<|eot_id|>", "</s>"];

impl Tokenizer {
    /// The prompt text for one user message: through the chat template when
    /// the tokenizer has one, the message itself otherwise.
    pub fn render_prompt(&self, user: &str) -> Result<String, Error> {
        self.render_prompt_with(user, None)
    }

    /// As [`Tokenizer::render_prompt`], with `enable_thinking` passed to the
    /// template when set (Qwen3's templates read it).
    pub fn render_prompt_with(
        &self,
        user: &str,
        enable_thinking: Option<bool>,
    ) -> Result<String, Error> {
        match self.chat_template() {
            Some(t) => render_with(t, user, self.bos_token(), self.eos_token(), enable_thinking),
            None => Ok(user.to_string()),
        }
    }

    /// The token that ends a response: the configured EOS, else a
    /// conventional end-of-text token of the vocabulary.
    pub fn end_token_id(&self) -> Option<u32> {
        self.eos_token_id()
            .or_else(|| CONVENTIONAL_EOS.iter().find_map(|t| self.token_to_id(t)))
    }

    /// Write tokenizer.json.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        self.inner()
            .save(path, false)
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// Render `template` for one user message.
pub fn render_user_prompt(
    template: &str,
    user: &str,
    bos: Option<&str>,
    eos: Option<&str>,
) -> Result<String, Error> {
    render_with(template, user, bos, eos, None)
}

fn render_with(
    template: &str,
    user: &str,
    bos: Option<&str>,
    eos: Option<&str>,
    enable_thinking: Option<bool>,
) -> Result<String, Error> {
    let mut env = Environment::new();
    // HF renders templates with Python's string methods (`.startswith`,
    // `.split`, `.lstrip`, slices such as `messages[::-1]`): Qwen3's uses them.
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    // transformers renders with these two on.
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    // HF templates call raise_exception(msg) to reject conversations.
    env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_template("chat", template)?;
    let tmpl = env.get_template("chat")?;
    let base = context! {
        messages => vec![context! { role => "user", content => user }],
        add_generation_prompt => true,
        bos_token => bos.unwrap_or(""),
        eos_token => eos.unwrap_or(""),
    };
    // Unset stays undefined, so `enable_thinking is defined` tests see HF's default.
    match enable_thinking {
        Some(on) => tmpl.render(context! { enable_thinking => on, ..base }),
        None => tmpl.render(base),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ChatML template Qwen models ship (its core, without tools).
    const CHATML: &str = "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

    #[test]
    fn chatml_user_turn() {
        let s = render_user_prompt(CHATML, "12+34=", None, None).unwrap();
        assert_eq!(
            s,
            "<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn llama3_style_with_bos() {
        let t = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";
        let s = render_user_prompt(t, " hi ", Some("<|begin_of_text|>"), None).unwrap();
        assert_eq!(s, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    }

    #[test]
    fn template_errors_are_errors() {
        assert!(render_user_prompt("{% for %}", "x", None, None).is_err());
        assert!(
            render_user_prompt("{{ raise_exception('no system role') }}", "x", None, None)
                .unwrap_err()
                .to_string()
                .contains("no system role")
        );
    }
}
