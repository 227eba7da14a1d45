//! The codec and the request parser, by example and by property. The properties run on every
//! `cargo test` (CI included); the fuzz target in `fuzz/` drives the same functions.

use proptest::prelude::*;

use super::*;

fn decode_all(max: usize, input: &[u8], split: &[usize]) -> (Vec<Frame>, usize) {
    let mut dec = FrameDecoder::new(max);
    let mut frames = Vec::new();
    let mut peak = 0;
    let mut feed = |mut part: &[u8], dec: &mut FrameDecoder| {
        while !part.is_empty() {
            let (used, frame) = dec.decode(part);
            peak = peak.max(dec.buffered());
            part = &part[used..];
            frames.extend(frame);
        }
    };
    let mut rest = input;
    for &cut in split {
        let cut = cut.min(rest.len());
        let (a, b) = rest.split_at(cut);
        feed(a, &mut dec);
        rest = b;
    }
    feed(rest, &mut dec);
    frames.extend(dec.finish());
    (frames, peak)
}

/// What the frames of `input` must be: split at `\n`, a trailing `\r` dropped, over-long
/// lines reported by length, an unterminated last line kept.
fn reference(max: usize, input: &[u8]) -> Vec<Frame> {
    let mut lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
        .into_iter()
        .map(|l| {
            if l.len() > max {
                Frame::TooLarge { len: l.len() }
            } else {
                let mut l = l.to_vec();
                if l.last() == Some(&b'\r') {
                    l.pop();
                }
                Frame::Line(l)
            }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any bytes, cut anywhere: the frames are exactly the reference split, and the decoder
    /// never holds more than `max` bytes.
    #[test]
    fn decoder_matches_reference_and_stays_bounded(
        input in proptest::collection::vec(
            prop_oneof![4 => any::<u8>(), 1 => Just(b'\n'), 1 => Just(b'\r')], 0..2048),
        split in proptest::collection::vec(0usize..300, 0..8),
        max in 1usize..200,
    ) {
        let (frames, peak) = decode_all(max, &input, &split);
        prop_assert!(peak <= max, "held {peak} > {max}");
        prop_assert_eq!(frames, reference(max, &input));
    }

    /// Every frame gets exactly one outcome, and only blank lines go unanswered. Nothing
    /// panics, whatever the bytes.
    #[test]
    fn every_bad_frame_is_answered(input in proptest::collection::vec(any::<u8>(), 0..512)) {
        let frame = Frame::Line(input.clone());
        match decode_frame(&frame) {
            Decoded::Blank => prop_assert!(input.iter().all(u8::is_ascii_whitespace)),
            Decoded::Error(_, e) => prop_assert!(!e.message.is_empty()),
            Decoded::Request(..) => {}
        }
    }

    /// JSON-shaped noise: envelopes with random members and params still get one answer,
    /// and a request is only accepted with a known method.
    #[test]
    fn json_noise_is_answered(
        id in prop_oneof![Just(json!(1)), Just(json!("x")), Just(json!(null)), Just(json!(-1)), Just(json!(1.5))],
        method in prop_oneof![
            Just("box.list".to_string()), Just("box.create".to_string()),
            Just("exec.stdin".to_string()), "[a-z.]{0,12}"],
        key in "[a-zA-Z]{1,8}",
        value in prop_oneof![Just(json!(1)), Just(json!("s")), Just(json!({})), Just(json!([]))],
    ) {
        let params = json!({ key.clone(): value });
        let line = serde_json::to_vec(&json!({ "id": id, "method": method, "params": params })).unwrap();
        match decode_frame(&Frame::Line(line)) {
            Decoded::Request(_, r) => prop_assert!(METHODS.contains(&r.method())),
            Decoded::Error(..) => {}
            Decoded::Blank => prop_assert!(false, "not blank"),
        }
    }

    /// Output bytes survive the encoder exactly, however they are chunked.
    #[test]
    fn output_encoding_is_lossless(
        data in proptest::collection::vec(
            prop_oneof![3 => 0x20u8..0x7f, 1 => any::<u8>(), 1 => 0xc3u8..0xc4, 1 => 0xa9u8..0xaa], 0..600),
        split in proptest::collection::vec(1usize..64, 0..10),
    ) {
        let mut enc = OutputEncoder::default();
        let mut out = Vec::new();
        let mut rest = &data[..];
        for &cut in &split {
            let cut = cut.min(rest.len());
            let (a, b) = rest.split_at(cut);
            enc.output(&mut out, 7, "stdout", a);
            rest = b;
        }
        enc.output(&mut out, 7, "stdout", rest);
        enc.finish(&mut out, 7);
        let mut got = Vec::new();
        for line in out.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let frame: Incoming = serde_json::from_slice(line).unwrap();
            prop_assert_eq!(frame.kind.as_deref(), Some("output"));
            prop_assert_eq!(frame.exec_id, Some(7));
            got.extend(frame.output_bytes().unwrap());
        }
        prop_assert_eq!(got, data);
    }
}

use serde_json::json;

fn decoded(line: &str) -> Decoded {
    decode_frame(&Frame::Line(line.as_bytes().to_vec()))
}

fn error_of(line: &str) -> (Option<Id>, ErrorCode, String) {
    match decoded(line) {
        Decoded::Error(id, e) => (id, e.code, e.message),
        other => panic!("{line}: expected an error, got {other:?}"),
    }
}

#[test]
fn requests_parse_with_defaults() {
    match decoded(r#"{"id":3,"method":"box.exec","params":{"name":"b","command":"ls"}}"#) {
        Decoded::Request(Id::Num(3), Request::BoxExec(p)) => {
            assert_eq!(p.command, "ls");
            assert!(p.stdin, "stdin defaults to a pipe");
            assert!(p.args.is_empty());
        }
        other => panic!("{other:?}"),
    }
    // Methods without required params accept a missing `params`.
    assert!(matches!(
        decoded(r#"{"id":"a","method":"box.list"}"#),
        Decoded::Request(Id::Str(_), Request::BoxList(_))
    ));
    // CRLF is a newline too.
    assert!(matches!(
        decode_frame(&Frame::Line(b"{\"id\":1,\"method\":\"shutdown\"}".to_vec())),
        Decoded::Request(_, Request::Shutdown(_))
    ));
}

#[test]
fn unknown_things_are_errors_not_ignored() {
    let (id, code, msg) = error_of(r#"{"id":1,"method":"box.destroy","params":{}}"#);
    assert_eq!((id, code), (Some(Id::Num(1)), ErrorCode::UnknownMethod));
    assert!(msg.contains("box.remove"), "lists the known methods: {msg}");

    let (id, code, msg) =
        error_of(r#"{"id":2,"method":"box.create","params":{"name":"b","blocknet":true}}"#);
    assert_eq!((id, code), (Some(Id::Num(2)), ErrorCode::InvalidParams));
    assert!(msg.contains("blocknet"), "names the field: {msg}");

    let (id, code, _) = error_of(r#"{"id":3,"method":"box.list","params":{},"extra":1}"#);
    assert_eq!((id, code), (Some(Id::Num(3)), ErrorCode::InvalidRequest));

    let (id, code, _) = error_of(r#"{"method":"box.list"}"#);
    assert_eq!((id, code), (None, ErrorCode::InvalidRequest));
    let (_, code, _) = error_of(r#"{"id":-1,"method":"box.list"}"#);
    assert_eq!(code, ErrorCode::InvalidRequest);
    let (_, code, _) = error_of(r#"{"id":1,"method":"box.start"}"#);
    assert_eq!(code, ErrorCode::InvalidParams, "required params");
    let (id, code, _) = error_of("{\"id\":1,");
    assert_eq!((id, code), (None, ErrorCode::ParseError));
    let (_, code, _) = error_of("[1,2]");
    assert_eq!(code, ErrorCode::InvalidRequest);
    assert!(matches!(
        decode_frame(&Frame::Line(vec![0xff, b'{'])),
        Decoded::Error(
            None,
            RpcError {
                code: ErrorCode::ParseError,
                ..
            }
        )
    ));
    assert!(matches!(decoded("   \t"), Decoded::Blank));
}

#[test]
fn size_limits_answer_with_the_id_when_it_can_be_read() {
    let pad = "x".repeat(MAX_REQUEST_BYTES);
    let line =
        format!(r#"{{"id":9,"method":"exec.stdin","params":{{"execId":1,"data":"{pad}"}}}}"#);
    let (id, code, _) = error_of(&line);
    assert_eq!((id, code), (Some(Id::Num(9)), ErrorCode::RequestTooLarge));
    match decode_frame(&Frame::TooLarge { len: 20 << 20 }) {
        Decoded::Error(None, e) => assert_eq!(e.code, ErrorCode::FrameTooLarge),
        other => panic!("{other:?}"),
    }
}

#[test]
fn versions_are_checked() {
    check_protocol(None).unwrap();
    check_protocol(Some(PROTOCOL)).unwrap();
    let e = check_protocol(Some("box-rust-0.1.0+jsonl-v1")).unwrap_err();
    assert_eq!(e.code, ErrorCode::UnsupportedProtocol);
    assert!(e.message.contains(PROTOCOL), "{}", e.message);
}

#[test]
fn replies_and_events_have_the_documented_shape() {
    let ok = encode_reply(Some(&Id::Num(1)), &Ok(json!({"ok": true})));
    assert_eq!(ok, br#"{"id":1,"result":{"ok":true}}"#);
    let err = encode_reply(None, &Err(RpcError::new(ErrorCode::FrameTooLarge, "big")));
    assert_eq!(
        err,
        br#"{"id":null,"error":{"code":"frameTooLarge","message":"big"}}"#
    );
    let exit = encode_event(
        "exit",
        &ExitEvent {
            exec_id: 4,
            exit_code: 143,
            signal: Some(15),
            timed_out: false,
            error_message: None,
            git_store: None,
            connections: Vec::new(),
        },
    );
    let v: serde_json::Value = serde_json::from_slice(&exit).unwrap();
    assert_eq!(
        v,
        json!({"type": "exit", "execId": 4, "exitCode": 143, "signal": 15})
    );
    let mut out = Vec::new();
    encode_output(&mut out, 4, "stderr", b"a\"\n", true);
    assert_eq!(
        out,
        br#"{"type":"output","execId":4,"stream":"stderr","data":"a\"\n"}"#
    );
    out.clear();
    encode_output(&mut out, 4, "stdout", &[0xff, 0], false);
    assert_eq!(
        out,
        br#"{"type":"output","execId":4,"stream":"stdout","data":"/wA=","encoding":"base64"}"#
    );
}

#[test]
fn split_utf8_stays_text() {
    let mut enc = OutputEncoder::default();
    let mut out = Vec::new();
    let e = "é".as_bytes();
    enc.output(&mut out, 1, "stdout", &[b'a', e[0]]);
    enc.output(&mut out, 1, "stdout", &[e[1], b'b']);
    let text = String::from_utf8(out).unwrap();
    assert!(!text.contains("base64"), "{text}");
    assert!(
        text.contains(r#""data":"a""#) && text.contains(r#""data":"éb""#),
        "{text}"
    );
}

#[test]
fn blocking_reader_matches_async_decoder() {
    let input = b"one\r\ntwo\n\nthree-is-long\nfour";
    let mut r = BlockingFrameReader::new(&input[..], 5);
    let mut got = Vec::new();
    while let Some(f) = r.next().unwrap() {
        got.push(f);
    }
    assert_eq!(got, reference(5, input));
}
