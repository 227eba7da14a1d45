//! The frame decoder and request parser on arbitrary bytes, fed in arbitrary pieces.
//!
//! `cargo fuzz run frame_decoder` (nightly, or `RUSTC_BOOTSTRAP=1` on stable). Checks: no
//! panic; the decoder never holds more than its limit; every non-blank frame gets exactly
//! one outcome (a request or an error reply).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandbox_protocol::{decode_frame, Decoded, FrameDecoder};

fuzz_target!(|data: &[u8]| {
    // The first byte picks a small limit so over-long frames are common; the second, how the
    // input is cut into reads.
    let (max, step, input) = match data {
        [a, b, rest @ ..] => (1 + *a as usize * 4, 1 + *b as usize, rest),
        _ => return,
    };
    let mut dec = FrameDecoder::new(max);
    let mut frames = Vec::new();
    for piece in input.chunks(step) {
        let mut piece = piece;
        while !piece.is_empty() {
            let (used, frame) = dec.decode(piece);
            assert!(used > 0 && used <= piece.len());
            assert!(dec.buffered() <= max, "decoder holds more than its limit");
            piece = &piece[used..];
            frames.extend(frame);
        }
    }
    frames.extend(dec.finish());
    let newlines = input.iter().filter(|&&b| b == b'\n').count();
    assert!(frames.len() == newlines || frames.len() == newlines + 1);
    for frame in &frames {
        match decode_frame(frame) {
            Decoded::Request(_, r) => {
                let _ = r.params();
            }
            Decoded::Error(_, e) => assert!(!e.message.is_empty()),
            Decoded::Blank => {}
        }
    }
});
