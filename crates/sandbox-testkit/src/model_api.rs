//! A stand-in for the model APIs the coding agents talk to, on loopback (plain HTTP, real
//! sockets, a thread per connection), speaking each agent's wire format:
//!
//! - Anthropic Messages (`POST …/v1/messages`, SSE when `stream` is set): Claude Code.
//! - OpenAI Responses (`POST …/responses`, SSE): Codex.
//! - Gemini (`POST …/models/M:streamGenerateContent?alt=sse` and `:generateContent`): Gemini CLI.
//! - OpenAI Chat Completions (`POST …/chat/completions`, SSE): pi with a `models.json`
//!   provider of `"api": "openai-completions"` (its form for any compatible endpoint).
//!
//! Every conversation goes the same way: while it holds no tool result, a request that offers
//! a shell tool gets ONE call of it running the stand-in's command; once it holds a tool
//! result, the reply is a short text that ends the turn. Requests that offer no shell tool (a
//! title, a classifier, a quota check) get a small JSON text that parses as any of the
//! agents' side questions. Every request is logged whole, so a test reads what the agent sent
//! back as the tool's output.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

pub use crate::net::Seen;

/// The stand-in: where it listens and what it saw.
pub struct ModelApi {
    pub port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// The names the agents give their shell tool, in order of preference: Claude Code's `Bash`,
/// Codex's `shell_command` / `exec_command` / `shell`, Gemini CLI's `run_shell_command`,
/// pi's `bash`.
const SHELL_TOOLS: &[&str] = &[
    "Bash",
    "shell_command",
    "exec_command",
    "shell",
    "run_shell_command",
    "bash",
];

impl ModelApi {
    /// Listens on 127.0.0.1 (a free port); the first reply of each conversation asks the agent
    /// to run `command` in its shell tool.
    pub fn start(command: &str) -> ModelApi {
        Self::listen(command, None)
    }

    /// [`ModelApi::start`] speaking HTTPS with a certificate of `ca` (made for `127.0.0.1`):
    /// the upstream of a `--credential`, whose proxy speaks only TLS to it.
    pub fn start_tls(command: &str, ca: &crate::net::TestCa) -> ModelApi {
        Self::listen(command, Some(ca.server_config()))
    }

    fn listen(command: &str, tls: Option<Arc<rustls::ServerConfig>>) -> ModelApi {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let command = command.to_owned();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (log, command, tls) = (log.clone(), command.clone(), tls.clone());
                std::thread::spawn(move || match tls {
                    None => serve(&mut { stream }, &command, &log),
                    Some(config) => {
                        if let Ok(conn) = rustls::ServerConnection::new(config) {
                            let mut tls = rustls::StreamOwned::new(conn, stream);
                            serve(&mut tls, &command, &log);
                            // The end of the stream, said in TLS: no truncation for the client.
                            tls.conn.send_close_notify();
                            let _ = tls.flush();
                        }
                    }
                });
            }
        });
        ModelApi { port, seen }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The bodies of the requests that carried a tool's result back (the command's output is
    /// in them, as the agent sent it).
    pub fn tool_results(&self) -> Vec<String> {
        self.seen()
            .into_iter()
            .filter(|s| {
                serde_json::from_str::<Value>(&s.body).is_ok_and(|body| has_tool_result(&body))
            })
            .map(|s| s.body)
            .collect()
    }

    /// What was asked and answered, one line a request (for a failing test's message).
    pub fn summary(&self) -> String {
        self.seen()
            .iter()
            .map(|s| {
                let mut body = s.body.clone();
                body.truncate(300);
                format!("{} {} {body}\n", s.method, s.path)
            })
            .collect()
    }
}

/// Reads requests off one connection and answers each; ends when the client closes, or
/// after a request that says `Connection: close` (as the credential proxy sends every one),
/// saying so in the response as HTTP/1.1 servers do.
fn serve<S: Read + Write>(stream: &mut S, command: &str, log: &Mutex<Vec<Seen>>) {
    let mut reader = BufReader::new(stream);
    while let Some(request) = read_request(&mut reader) {
        let (status, content_type, body) = answer(&request, command);
        let close = request
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"));
        log.lock().unwrap().push(request);
        let head = format!(
            "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\
             cache-control: no-cache\r\n{}\r\n",
            body.len(),
            if close { "connection: close\r\n" } else { "" }
        );
        let writer = reader.get_mut();
        if writer.write_all(head.as_bytes()).is_err()
            || writer.write_all(body.as_bytes()).is_err()
            || writer.flush().is_err()
            || close
        {
            return;
        }
    }
}

fn read_request<S: Read>(reader: &mut BufReader<S>) -> Option<Seen> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut words = line.split_whitespace();
    let method = words.next()?.to_owned();
    let path = words.next()?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(len) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(len, 0);
        reader.read_exact(&mut body).ok()?;
    }
    Some(Seen {
        method,
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Whether a request's conversation already holds a tool's result, in any of the formats.
fn has_tool_result(body: &Value) -> bool {
    let list = |key: &str| body[key].as_array().cloned().unwrap_or_default();
    // Anthropic: a user message's `tool_result` block. Chat Completions: a `tool` message.
    list("messages").iter().any(|m| {
        m["role"] == "tool"
            || m["content"]
                .as_array()
                .is_some_and(|c| c.iter().any(|b| b["type"] == "tool_result"))
    })
    // Responses: a `function_call_output` item.
    || list("input").iter().any(|i| {
        i["type"] == "function_call_output" || i["type"] == "custom_tool_call_output"
    })
    // Gemini: a `functionResponse` part.
    || list("contents").iter().any(|c| {
        c["parts"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p.get("functionResponse").is_some()))
    })
}

/// Every tool a request offers, with its parameters' JSON schema (`Null` for a free-form
/// one): Anthropic {name, input_schema}; Responses {type, name, parameters}, at the top or in
/// an `additional_tools` input item's namespaces (Codex); Chat Completions {type, function:
/// {name, parameters}}; Gemini {functionDeclarations: [{name, parameters |
/// parametersJsonSchema}]}.
fn offered(body: &Value) -> Vec<(String, Value)> {
    fn walk(tools: &Value, out: &mut Vec<(String, Value)>) {
        for tool in tools.as_array().into_iter().flatten() {
            if tool.get("tools").is_some() {
                walk(&tool["tools"], out);
                continue;
            }
            let decls = tool["functionDeclarations"]
                .as_array()
                .cloned()
                .unwrap_or_else(|| vec![tool.get("function").unwrap_or(tool).clone()]);
            for d in decls {
                if let Some(name) = d["name"].as_str() {
                    let schema = ["input_schema", "parameters", "parametersJsonSchema"]
                        .iter()
                        .map(|k| d[*k].clone())
                        .find(|s| !s.is_null())
                        .unwrap_or(Value::Null);
                    out.push((name.to_owned(), schema));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(&body["tools"], &mut out);
    for item in body["input"].as_array().into_iter().flatten() {
        if item["type"] == "additional_tools" {
            walk(&item["tools"], &mut out);
        }
    }
    out
}

/// The shell tool a request offers: its name and its parameters' JSON schema.
fn shell_tool(body: &Value) -> Option<(String, Value)> {
    let offered = offered(body);
    SHELL_TOOLS
        .iter()
        .find_map(|want| offered.iter().find(|(name, _)| name == want).cloned())
}

/// The shell tool's arguments that run `command`, shaped by its schema: the command as a
/// string (`command`, `cmd`) or an argv (`["bash", "-lc", …]`), and a description where one
/// is required.
fn shell_args(schema: &Value, command: &str) -> Value {
    let props = &schema["properties"];
    let mut args = serde_json::Map::new();
    let key = if props.get("cmd").is_some() {
        "cmd"
    } else {
        "command"
    };
    let is_array = props[key]["type"]
        .as_str()
        .is_some_and(|t| t.eq_ignore_ascii_case("array"));
    args.insert(
        key.to_owned(),
        if is_array {
            json!(["bash", "-lc", command])
        } else {
            json!(command)
        },
    );
    if props.get("description").is_some() {
        args.insert("description".into(), json!("Run the toolchain and commit"));
    }
    Value::Object(args)
}

/// What the model "says": a call of the shell tool, or text.
enum Turn {
    Call {
        name: String,
        args: Value,
    },
    /// Codex's code mode: its only tool is the free-form `exec`, JavaScript that calls the
    /// shell tool as `tools.exec_command(…)`.
    Code {
        name: String,
        source: String,
    },
    Text(String),
}

fn turn(body: &Value, command: &str) -> Turn {
    if has_tool_result(body) {
        return Turn::Text("Done: the command ran and the commit is made.".into());
    }
    let code_mode = || offered(body).iter().any(|(name, _)| name == "exec");
    match shell_tool(body) {
        Some((name, schema)) => Turn::Call {
            args: shell_args(&schema, command),
            name,
        },
        None if code_mode() => Turn::Code {
            name: "exec".into(),
            source: format!(
                "const r = await tools.exec_command({});\ntext(r.output);\n",
                json!({"cmd": command, "yield_time_ms": 30000})
            ),
        },
        // A side question (a title, a routing classifier, the next-speaker check): one JSON
        // object that parses as each of their answers.
        None => Turn::Text(
            json!({"reasoning": "stand-in", "model_choice": "flash", "next_speaker": "user",
                   "title": "stand-in", "isNewTopic": false})
            .to_string(),
        ),
    }
}

fn answer(req: &Seen, command: &str) -> (&'static str, &'static str, String) {
    const JSON: &str = "application/json";
    const SSE: &str = "text/event-stream";
    let path = req.path.split('?').next().unwrap_or_default();
    let body: Value = serde_json::from_str(&req.body).unwrap_or(Value::Null);
    let stream = body["stream"].as_bool().unwrap_or(false);
    let model = body["model"].as_str().unwrap_or("stand-in").to_owned();
    if req.method == "GET" && path.ends_with("/responses") {
        // Codex tries a WebSocket first: refused, it falls back to HTTP and SSE.
        (
            "404 Not Found",
            JSON,
            json!({"error": "no websocket"}).to_string(),
        )
    } else if path.ends_with("/count_tokens") {
        ("200 OK", JSON, json!({"input_tokens": 1}).to_string())
    } else if path.ends_with("/messages") {
        let turn = turn(&body, command);
        if stream {
            ("200 OK", SSE, anthropic_sse(&model, &turn))
        } else {
            ("200 OK", JSON, anthropic_message(&model, &turn).to_string())
        }
    } else if path.ends_with("/responses") {
        ("200 OK", SSE, responses_sse(&model, &turn(&body, command)))
    } else if path.ends_with("/chat/completions") {
        ("200 OK", SSE, chat_sse(&model, &turn(&body, command)))
    } else if path.contains(":countTokens") {
        ("200 OK", JSON, json!({"totalTokens": 1}).to_string())
    } else if path.contains(":streamGenerateContent") {
        let reply = gemini_reply(&turn(&body, command));
        ("200 OK", SSE, format!("data: {reply}\r\n\r\n"))
    } else if path.contains(":generateContent") {
        (
            "200 OK",
            JSON,
            gemini_reply(&turn(&body, command)).to_string(),
        )
    } else if req.method == "GET" && path.ends_with("/models") {
        (
            "200 OK",
            JSON,
            json!({"object": "list", "data": [], "models": []}).to_string(),
        )
    } else {
        (
            "404 Not Found",
            JSON,
            json!({"error": "stand-in"}).to_string(),
        )
    }
}

fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

fn anthropic_blocks(turn: &Turn) -> (Value, &'static str) {
    match turn {
        Turn::Call { name, args } => (
            json!([{"type": "tool_use", "id": "toolu_standin01", "name": name, "input": args}]),
            "tool_use",
        ),
        Turn::Text(text) => (json!([{"type": "text", "text": text}]), "end_turn"),
        Turn::Code { source, .. } => (json!([{"type": "text", "text": source}]), "end_turn"),
    }
}

fn anthropic_message(model: &str, turn: &Turn) -> Value {
    let (content, stop) = anthropic_blocks(turn);
    json!({"id": "msg_standin", "type": "message", "role": "assistant", "model": model,
           "content": content, "stop_reason": stop, "stop_sequence": null,
           "usage": {"input_tokens": 10, "output_tokens": 5}})
}

fn anthropic_sse(model: &str, turn: &Turn) -> String {
    let (_, stop) = anthropic_blocks(turn);
    let mut out = event(
        "message_start",
        &json!({"type": "message_start", "message": {"id": "msg_standin", "type": "message",
            "role": "assistant", "model": model, "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 1}}}),
    );
    let (start, delta) = match turn {
        Turn::Call { name, args } => (
            json!({"type": "tool_use", "id": "toolu_standin01", "name": name, "input": {}}),
            json!({"type": "input_json_delta", "partial_json": args.to_string()}),
        ),
        Turn::Text(text) | Turn::Code { source: text, .. } => (
            json!({"type": "text", "text": ""}),
            json!({"type": "text_delta", "text": text}),
        ),
    };
    out += &event(
        "content_block_start",
        &json!({"type": "content_block_start", "index": 0, "content_block": start}),
    );
    out += &event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": 0, "delta": delta}),
    );
    out += &event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    );
    out += &event(
        "message_delta",
        &json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                "usage": {"output_tokens": 5}}),
    );
    out + &event("message_stop", &json!({"type": "message_stop"}))
}

fn responses_sse(model: &str, turn: &Turn) -> String {
    let item = match turn {
        Turn::Call { name, args } => json!({"type": "function_call", "id": "fc_standin",
            "call_id": "call_standin", "name": name, "arguments": args.to_string(),
            "status": "completed"}),
        Turn::Code { name, source } => json!({"type": "custom_tool_call", "id": "ctc_standin",
            "call_id": "call_standin", "name": name, "input": source,
            "status": "completed"}),
        Turn::Text(text) => json!({"type": "message", "id": "msg_standin", "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}),
    };
    let usage = json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15});
    let response = |status: &str, output: Value| {
        json!({"id": "resp_standin", "object": "response", "created_at": 0, "model": model,
               "status": status, "output": output, "usage": usage})
    };
    let mut out = event(
        "response.created",
        &json!({"type": "response.created", "sequence_number": 0,
                "response": response("in_progress", json!([]))}),
    );
    out += &event(
        "response.output_item.added",
        &json!({"type": "response.output_item.added", "sequence_number": 1,
                "output_index": 0, "item": item}),
    );
    if let Turn::Text(text) = turn {
        out += &event(
            "response.output_text.delta",
            &json!({"type": "response.output_text.delta", "sequence_number": 2,
                    "item_id": "msg_standin", "output_index": 0, "content_index": 0,
                    "delta": text}),
        );
    }
    out += &event(
        "response.output_item.done",
        &json!({"type": "response.output_item.done", "sequence_number": 3,
                "output_index": 0, "item": item}),
    );
    out + &event(
        "response.completed",
        &json!({"type": "response.completed", "sequence_number": 4,
                "response": response("completed", json!([item]))}),
    )
}

fn chat_sse(model: &str, turn: &Turn) -> String {
    let chunk = |delta: Value, finish: Value| {
        let c = json!({"id": "chatcmpl-standin", "object": "chat.completion.chunk",
            "created": 0, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}});
        format!("data: {c}\n\n")
    };
    let (delta, finish) = match turn {
        Turn::Call { name, args } => (
            json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0,
                "id": "call_standin", "type": "function",
                "function": {"name": name, "arguments": args.to_string()}}]}),
            "tool_calls",
        ),
        Turn::Text(text) | Turn::Code { source: text, .. } => {
            (json!({"role": "assistant", "content": text}), "stop")
        }
    };
    chunk(delta, Value::Null) + &chunk(json!({}), json!(finish)) + "data: [DONE]\n\n"
}

fn gemini_reply(turn: &Turn) -> Value {
    let part = match turn {
        Turn::Call { name, args } => json!({"functionCall": {"name": name, "args": args}}),
        Turn::Text(text) | Turn::Code { source: text, .. } => json!({"text": text}),
    };
    json!({"candidates": [{"content": {"role": "model", "parts": [part]},
            "finishReason": "STOP", "index": 0}],
           "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5,
                             "totalTokenCount": 15},
           "modelVersion": "stand-in"})
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpStream;

    fn post(port: u16, path: &str, body: &Value) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let body = body.to_string();
        write!(
            s,
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut reader = BufReader::new(s);
        let mut len = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut out = vec![0; len];
        reader.read_exact(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_conversation_gets_one_shell_call_then_the_end_in_each_format() {
        let api = ModelApi::start("cargo --version");
        let schema = json!({"type": "object", "properties": {"command": {"type": "string"}}});
        // Anthropic, streamed.
        let first = post(
            api.port,
            "/v1/messages?beta=true",
            &json!({"stream": true, "tools": [{"name": "Bash", "input_schema": schema}],
                    "messages": [{"role": "user", "content": "go"}]}),
        );
        assert!(
            first.contains(r#"\"command\":\"cargo --version\""#),
            "{first}"
        );
        assert!(first.contains("\"stop_reason\":\"tool_use\""), "{first}");
        let second = post(
            api.port,
            "/v1/messages",
            &json!({"tools": [{"name": "Bash", "input_schema": schema}],
                    "messages": [{"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "t", "content": "cargo 1.0"}]}]}),
        );
        assert!(second.contains("end_turn"), "{second}");
        // Responses: an argv-shaped shell.
        let argv = json!({"properties": {"command": {"type": "array"}}});
        let call = post(
            api.port,
            "/v1/responses",
            &json!({"tools": [{"type": "function", "name": "shell", "parameters": argv}],
                    "input": []}),
        );
        assert!(
            call.contains(r#"[\"bash\",\"-lc\",\"cargo --version\"]"#),
            "{call}"
        );
        // Gemini and Chat Completions.
        let gemini = post(
            api.port,
            "/v1beta/models/m:streamGenerateContent?alt=sse",
            &json!({"tools": [{"functionDeclarations": [
                {"name": "run_shell_command", "parametersJsonSchema": schema}]}],
                    "contents": [{"role": "user", "parts": [{"text": "go"}]}]}),
        );
        assert!(
            gemini.starts_with("data: ") && gemini.contains("functionCall"),
            "{gemini}"
        );
        let chat = post(
            api.port,
            "/v1/chat/completions",
            &json!({"tools": [{"type": "function", "function": {"name": "bash",
                        "parameters": schema}}],
                    "messages": [{"role": "tool", "content": "cargo 1.0"}]}),
        );
        assert!(chat.contains("\"finish_reason\":\"stop\"") && chat.ends_with("[DONE]\n\n"));
        assert_eq!(api.tool_results().len(), 2);
        assert_eq!(api.seen().len(), 5);
    }
}
