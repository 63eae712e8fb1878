//! Chat templates as Hugging Face checkpoints ship them: Jinja text in
//! `chat_template.jinja`, or `chat_template` in `tokenizer_config.json`
//! (older checkpoints), rendered with the environment transformers gives
//! them (trimmed blocks, `raise_exception`, `bos_token`/`eos_token`,
//! `add_generation_prompt`, `tojson`, `strftime_now`, Python string
//! methods).

use minijinja::{context, Environment, Error, ErrorKind, Value};
use std::path::Path;

/// A checkpoint's chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

/// A special token as tokenizer_config.json writes it: a string or
/// `{"content": ...}`.
fn token_text(v: Option<&serde_json::Value>) -> String {
    match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Object(o)) => o
            .get("content")
            .and_then(|c| c.as_str())
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

/// Today's date formatted with the few `strftime` codes templates use.
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let name = MONTHS[(month - 1) as usize];
    fmt.replace("%d", &format!("{day:02}"))
        .replace("%m", &format!("{month:02}"))
        .replace("%Y", &year.to_string())
        .replace("%B", name)
        .replace("%b", &name[..3])
}

impl ChatTemplate {
    /// The template of the checkpoint in `dir`, if it has one.
    pub fn from_dir(dir: &Path) -> Result<Option<ChatTemplate>, String> {
        let config: serde_json::Value =
            match std::fs::read_to_string(dir.join("tokenizer_config.json")) {
                Ok(t) => {
                    serde_json::from_str(&t).map_err(|e| format!("tokenizer_config.json: {e}"))?
                }
                Err(_) => serde_json::Value::Null,
            };
        let source = match std::fs::read_to_string(dir.join("chat_template.jinja")) {
            Ok(t) => Some(t),
            Err(_) => match config.get("chat_template") {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                // A list of named templates: the one named "default".
                Some(serde_json::Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
                _ => None,
            },
        };
        let Some(source) = source else {
            return Ok(None);
        };
        let bos = token_text(config.get("bos_token"));
        let eos = token_text(config.get("eos_token"));
        ChatTemplate::new(source, bos, eos).map(Some)
    }

    /// A template from its Jinja source and the special tokens it may use.
    pub fn new(source: String, bos: String, eos: String) -> Result<ChatTemplate, String> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source)
            .map_err(|e| format!("chat template: {e}"))?;
        Ok(ChatTemplate { env, bos, eos })
    }

    /// The prompt text for `messages` (OpenAI's list of `{role, content}`),
    /// ending with the assistant's turn opened.
    pub fn render(&self, messages: &serde_json::Value) -> Result<String, String> {
        let tmpl = self.env.get_template("chat").map_err(|e| e.to_string())?;
        tmpl.render(context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => true,
            bos_token => self.bos.clone(),
            eos_token => self.eos.clone(),
        })
        .map_err(|e| {
            // raise_exception's message is the template's own words.
            let mut m = e.to_string();
            if let Some(detail) = e.detail() {
                m = detail.to_string();
            }
            m
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if message['role'] == 'system' and loop.first %}{{ bos_token }}{% endif %}<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    #[test]
    fn renders_a_chatml_template_with_python_methods_and_exceptions() {
        let t = ChatTemplate::new(CHATML.into(), "<s>".into(), "</s>".into()).unwrap();
        let m = serde_json::json!([{"role": "system", "content": " be brief "}, {"role": "user", "content": "hi"}]);
        assert_eq!(
            t.render(&m).unwrap(),
            "<s><|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        let py = "{{ messages[0]['content'].strip().upper() }}{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}";
        let t = ChatTemplate::new(py.into(), String::new(), String::new()).unwrap();
        assert_eq!(
            t.render(&serde_json::json!([{"role": "user", "content": " a "}]))
                .unwrap(),
            "A"
        );
        let err = t.render(&m).unwrap_err();
        assert!(err.contains("one message only"), "{err}");
        assert!(strftime_now("%d %b %Y".into()).len() == 11);
    }
}
