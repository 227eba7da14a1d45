//! Byte-exact output through a box. BoxLite 0.10.8 hands a command's stdout and stderr over
//! as `String`s (its portal decodes the guest's bytes with U+FFFD for what is not UTF-8), and
//! its newest crate, 0.11.0, has no runtime files to match (the wheel is still 0.10.8). So the
//! bytes are encoded inside the box, where they are still exact: the command runs under a
//! small Perl relay (perl-base is essential in Debian, so the box image has it) that gives it
//! pipes for stdout and stderr and then *execs* it, so the command keeps the pid BoxLite
//! signals and the exit status BoxLite reports. A child the relay forks before the exec reads
//! the pipes and writes each chunk as it arrives (no buffering, so interactive output streams)
//! as one line of hex on the same stream. [`Decoder`] turns the lines back into the bytes.
//!
//! Stdin needs none of this: BoxLite's `ExecStdin` carries bytes.

/// The relay: `perl -e RELAY COMMAND ARGS...`. Only built-ins (no modules), so a minimal
/// Perl runs it. Exit 127 (not found) or 126 (not executable) when the exec fails, with the
/// reason on stderr, as a shell would.
pub const RELAY: &str = r#"
pipe(my $or, my $ow) or die "relay: pipe: $!\n";
pipe(my $er, my $ew) or die "relay: pipe: $!\n";
my $pid = fork();
die "relay: fork: $!\n" unless defined $pid;
if ($pid == 0) {
    close $ow; close $ew; close STDIN;
    my %open = (fileno($or) => [$or, \*STDOUT], fileno($er) => [$er, \*STDERR]);
    while (%open) {
        my $rin = '';
        vec($rin, $_, 1) = 1 for keys %open;
        my $rout;
        next if select($rout = $rin, undef, undef, undef) <= 0;
        for my $fd (keys %open) {
            next unless vec($rout, $fd, 1);
            my ($r, $w) = @{$open{$fd}};
            my $n = sysread($r, my $buf, 65536);
            next if !defined $n && $! == 4;
            if (!$n) { delete $open{$fd}; next; }
            my $line = unpack("H*", $buf) . "\n";
            while (length $line) {
                my $k = syswrite($w, $line);
                exit 1 unless defined $k;
                substr($line, 0, $k) = '';
            }
        }
    }
    exit 0;
}
open(STDOUT, '>&', $ow) or die "relay: stdout: $!\n";
open(STDERR, '>&', $ew) or die "relay: stderr: $!\n";
close $or; close $er; close $ow; close $ew;
exec { $ARGV[0] } @ARGV;
my $why = $!;
print STDERR "$ARGV[0]: $why\n";
exit($why + 0 == 2 ? 127 : 126);
"#;

/// The program and arguments that run `command args` under the relay.
pub fn wrap(command: &str, args: &[String]) -> (String, Vec<String>) {
    let mut argv = vec!["-e".to_string(), RELAY.to_string(), command.to_string()];
    argv.extend(args.iter().cloned());
    ("perl".to_string(), argv)
}

/// The command that tells whether a box can run the relay (exits 0 where it can).
pub fn probe() -> (String, Vec<String>) {
    ("perl".to_string(), vec!["-e".into(), "exit 0".into()])
}

/// A relay's line that is not hex: the stream did not come from the relay.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("boxlite: the output relay sent a line that is not hex ({0:?})")]
pub struct NotHex(pub String);

/// Turns one stream's text, in pieces of any size, back into the bytes the command wrote.
#[derive(Debug, Default)]
pub struct Decoder {
    pending: String,
}

impl Decoder {
    /// Feeds a piece of the stream; returns the bytes of every line it completed.
    pub fn push(&mut self, text: &str) -> Result<Vec<u8>, NotHex> {
        self.pending.push_str(text);
        let Some(end) = self.pending.rfind('\n') else {
            return Ok(Vec::new());
        };
        let complete: String = self.pending.drain(..=end).collect();
        let mut out = Vec::new();
        for line in complete.split('\n').filter(|l| !l.is_empty()) {
            decode_hex(line, &mut out)?;
        }
        Ok(out)
    }

    /// The end of the stream: what is left must be nothing (the relay ends every line).
    pub fn finish(self) -> Result<(), NotHex> {
        if self.pending.is_empty() {
            Ok(())
        } else {
            Err(NotHex(self.pending))
        }
    }
}

fn decode_hex(line: &str, out: &mut Vec<u8>) -> Result<(), NotHex> {
    let bad = || NotHex(line.chars().take(40).collect());
    if line.len() % 2 != 0 {
        return Err(bad());
    }
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    for pair in line.as_bytes().chunks(2) {
        match (digit(pair[0]), digit(pair[1])) {
            (Some(h), Some(l)) => out.push(h << 4 | l),
            _ => return Err(bad()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    fn perl() -> bool {
        Command::new("perl")
            .args(["-e", "exit 0"])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Runs `argv` under the real relay with real perl, decoding both streams.
    fn relayed(argv: &[&str], stdin: &[u8]) -> (Vec<u8>, Vec<u8>, std::process::ExitStatus) {
        let args: Vec<String> = argv[1..].iter().map(|s| s.to_string()).collect();
        let (program, args) = wrap(argv[0], &args);
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        let decode = |bytes: &[u8]| {
            let mut d = Decoder::default();
            // In pieces that cut lines anywhere, as BoxLite's stream may.
            let text = String::from_utf8(bytes.to_vec()).unwrap();
            let mut all = Vec::new();
            for piece in text.as_bytes().chunks(7) {
                all.extend(d.push(std::str::from_utf8(piece).unwrap()).unwrap());
            }
            d.finish().unwrap();
            all
        };
        (decode(&out.stdout), decode(&out.stderr), out.status)
    }

    #[test]
    fn every_byte_crosses_both_streams_and_the_status_is_the_commands() {
        if !perl() {
            sandbox_testkit::skip("perl", "no perl on this machine to run the relay with");
            return;
        }
        let all: Vec<u8> = (0u8..=255).collect();
        let (out, err, status) =
            relayed(&["sh", "-c", "cat; printf '\\377\\000e' >&2; exit 7"], &all);
        assert_eq!(
            out, all,
            "stdout byte for byte (stdin too: it went through cat)"
        );
        assert_eq!(err, b"\xff\x00e");
        assert_eq!(status.code(), Some(7));
        // The command is the process the relay became: a signal to it is its own death.
        let (_, _, status) = relayed(&["sh", "-c", "kill -TERM $$"], b"");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(15)
        );
        let (_, err, status) = relayed(&["/nonexistent-command"], b"");
        assert_eq!(status.code(), Some(127));
        assert!(String::from_utf8_lossy(&err).contains("/nonexistent-command"));
    }

    #[test]
    fn the_decoder_takes_pieces_and_refuses_what_is_not_hex() {
        let mut d = Decoder::default();
        assert_eq!(d.push("00f").unwrap(), b"");
        assert_eq!(d.push("f\n41").unwrap(), b"\x00\xff");
        assert_eq!(d.push("\n").unwrap(), b"A");
        d.finish().unwrap();
        assert!(Decoder::default().push("zz\n").is_err());
        assert!(Decoder::default().push("abc\n").is_err());
        let mut d = Decoder::default();
        d.push("ab").unwrap();
        assert!(d.finish().is_err(), "a line the relay did not end");
    }
}
