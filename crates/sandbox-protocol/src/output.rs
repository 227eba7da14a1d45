//! The `output` event: a command's bytes, as text when they are UTF-8 and as base64 when
//! not, exact either way; and the decoding of `exec.stdin`'s and `output`'s `data`.

use crate::error::{ErrorCode, RpcError};
use crate::exec::Encoding;
use crate::json;

/// Appends an `output` event for `data` to `out`. Valid UTF-8 goes as a JSON string; anything
/// else as base64 with `"encoding":"base64"`. Either way the client gets the exact bytes.
pub fn encode_output(out: &mut Vec<u8>, exec_id: u64, stream: &str, data: &[u8], text: bool) {
    use base64::Engine as _;
    out.extend_from_slice(b"{\"type\":\"output\",\"execId\":");
    out.extend_from_slice(exec_id.to_string().as_bytes());
    out.extend_from_slice(b",\"stream\":\"");
    out.extend_from_slice(stream.as_bytes());
    out.extend_from_slice(b"\",\"data\":");
    match std::str::from_utf8(data) {
        Ok(s) if text => json::write(out, s),
        _ => {
            out.push(b'"');
            let start = out.len();
            // Padded base64 is 4 bytes per started 3; a slice holds at most `isize::MAX`
            // bytes, so this cannot overflow.
            out.resize(start + data.len().div_ceil(3) * 4, 0);
            let engine = &base64::engine::general_purpose::STANDARD;
            match engine.encode_slice(data, &mut out[start..]) {
                Ok(written) => out.truncate(start + written),
                // Not reached (the buffer is sized above); encoding afresh keeps the bytes exact.
                Err(_) => {
                    out.truncate(start);
                    out.extend_from_slice(engine.encode(data).as_bytes());
                }
            }
            out.extend_from_slice(b"\",\"encoding\":\"base64\"");
        }
    }
    out.push(b'}');
}

/// Encodes one connection's `output` events, keeping text text across chunk boundaries: an
/// incomplete UTF-8 sequence at the end of a chunk is held back (at most 3 bytes per stream)
/// until the next chunk completes it — or the exec ends, when it goes out as base64. A chunk
/// with bytes that are not UTF-8 goes out whole as base64. Either way the bytes are exact.
#[derive(Debug, Default)]
pub struct OutputEncoder {
    carry: std::collections::HashMap<(u64, &'static str), Vec<u8>>,
}

impl OutputEncoder {
    /// Appends zero or one `output` frame (with its newline) for `data` to `out`.
    pub fn output(&mut self, out: &mut Vec<u8>, exec_id: u64, stream: &'static str, data: &[u8]) {
        let key = (exec_id, stream);
        let joined;
        let bytes: &[u8] = match self.carry.remove(&key) {
            Some(mut held) => {
                held.extend_from_slice(data);
                joined = held;
                &joined
            }
            None => data,
        };
        match std::str::from_utf8(bytes) {
            Ok(_) => encode_output(out, exec_id, stream, bytes, true),
            // Only an incomplete sequence at the very end: send the text before it.
            Err(e) if e.error_len().is_none() => {
                let (text, rest) = bytes.split_at(e.valid_up_to());
                self.carry.insert(key, rest.to_vec());
                if text.is_empty() {
                    return;
                }
                encode_output(out, exec_id, stream, text, true);
            }
            Err(_) => encode_output(out, exec_id, stream, bytes, false),
        }
        out.push(b'\n');
    }

    /// Flushes what is held for `exec_id` (before its `exit` event).
    pub fn finish(&mut self, out: &mut Vec<u8>, exec_id: u64) {
        for stream in ["stdout", "stderr"] {
            if let Some(held) = self.carry.remove(&(exec_id, stream)) {
                encode_output(out, exec_id, stream, &held, false);
                out.push(b'\n');
            }
        }
    }
}

/// Decodes `data` of an `exec.stdin` request or `output` event.
pub fn decode_data(data: &str, encoding: Encoding) -> Result<Vec<u8>, RpcError> {
    use base64::Engine as _;
    match encoding {
        Encoding::Utf8 => Ok(data.as_bytes().to_vec()),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| RpcError::new(ErrorCode::InvalidParams, format!("data: bad base64: {e}"))),
    }
}
