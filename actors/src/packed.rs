//! Compact byte encodings of what plegd keeps for a long time in large numbers: the
//! events of the publisher's history (see `subscription`). A [`LifecycleEvent`] as a
//! struct takes ≈ 680 bytes of heap (its own block, seven strings each in a block of
//! its own, the `Arc`); packed into one block it takes ≈ 120 (65,536 events of
//! history took 43.5 MiB as structs).
//!
//! The format is private to this process and written only by [`PackedEvent::pack`]:
//! fixed-width revision first (so the history can binary-search it without decoding),
//! then LEB128 integers and strings as [`Writer::compact`] writes them (a runtime's
//! 64-hex IDs and a pod's UID as the bytes they spell). The pod cache packs its
//! entries with the same pieces (`packed_status`).

use std::cell::Cell;
use std::time::{Duration, SystemTime};

use plegd_runtime::PodRef;

use crate::event::{EventKind, Exit, LifecycleEvent, RelistSource};

/// [`Writer::compact`]'s kinds of string (the header's two low bits).
const PLAIN: u64 = 0;
const HEX_TAIL: u64 = 1;
const UUID: u64 = 2;
/// Hex tails shorter than this are left as they are (a few bytes would not pay for
/// the second length).
const MIN_HEX_TAIL: usize = 16;
const HEX: &[u8; 16] = b"0123456789abcdef";

fn is_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

fn nibble(b: u8) -> u8 {
    if b.is_ascii_digit() {
        b - b'0'
    } else {
        b - b'a' + 10
    }
}

/// The 32 bytes a runtime's ID of 64 lowercase hex digits spells, or None for any
/// other string.
pub(crate) fn hex_32(s: &str) -> Option<[u8; 32]> {
    let b: &[u8; 64] = s.as_bytes().try_into().ok()?;
    let mut out = [0u8; 32];
    // Eight digits at a time, in the bytes of a u64 (the global relist packs every
    // listed ID, three per container).
    for (four, eight) in out.chunks_exact_mut(4).zip(b.chunks_exact(8)) {
        let mut word = [0u8; 8];
        word.copy_from_slice(eight);
        four.copy_from_slice(&hex_8(u64::from_le_bytes(word))?.to_le_bytes());
    }
    Some(out)
}

/// The 4 bytes 8 lowercase hex digits spell (the digits as a little-endian u64's
/// bytes, the first digit lowest), or None if any byte is no such digit.
fn hex_8(x: u64) -> Option<u32> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = ONES * 0x80;
    if x & HIGH != 0 {
        return None;
    }
    // Below 0x80, adding (0x80 − lo) sets a byte's high bit iff it is ≥ lo, and no
    // byte carries into the next.
    let at_least = |lo: u64| x + ONES * (0x80 - lo);
    let digit = at_least(0x30) & !at_least(0x3a) & HIGH;
    let letter = at_least(0x61) & !at_least(0x67) & HIGH;
    if digit | letter != HIGH {
        return None;
    }
    let nibbles = (x & (ONES * 0x0f)) + (letter >> 7) * 9;
    // Each pair of digits into the low byte of its 16-bit lane, then the lanes'
    // low bytes together.
    const LANES: u64 = 0x00ff_00ff_00ff_00ff;
    let pairs = ((nibbles & LANES) << 4) | ((nibbles >> 8) & LANES);
    let pairs = (pairs | (pairs >> 8)) & 0x0000_ffff_0000_ffff;
    let pairs = (pairs | (pairs >> 16)) & 0xffff_ffff;
    u32::try_from(pairs).ok()
}

/// The lowercase hex digits that spell `bytes`, into `out` (twice as long).
pub(crate) fn spell_hex(bytes: &[u8], out: &mut [u8]) {
    for (pair, &byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 15)];
    }
}

/// The length of the longest tail of `s` made of lowercase hex digits, cut to an even
/// number of them.
fn hex_tail(s: &str) -> usize {
    let n = s.bytes().rev().take_while(|&b| is_hex(b)).count();
    n & !1
}

/// The 16 bytes of a UUID in its canonical lowercase form (8-4-4-4-12), or None.
fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    let b = s.as_bytes();
    if b.len() != 36 {
        return None;
    }
    let mut out = [0u8; 16];
    let mut digits = b
        .iter()
        .enumerate()
        .filter(|&(i, _)| !matches!(i, 8 | 13 | 18 | 23))
        .map(|(_, &c)| c);
    if [8, 13, 18, 23].iter().any(|&i| b[i] != b'-') {
        return None;
    }
    for byte in &mut out {
        let (hi, lo) = (digits.next()?, digits.next()?);
        if !is_hex(hi) || !is_hex(lo) {
            return None;
        }
        *byte = nibble(hi) << 4 | nibble(lo);
    }
    Some(out)
}

/// Appends values to a byte buffer.
pub(crate) struct Writer<'a>(pub(crate) &'a mut Vec<u8>);

impl Writer<'_> {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }

    pub(crate) fn u64(&mut self, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(byte);
                return;
            }
            self.0.push(byte | 0x80);
        }
    }

    pub(crate) fn i64(&mut self, v: i64) {
        // Zigzag: small negative numbers stay short.
        self.u64(((v << 1) ^ (v >> 63)) as u64);
    }

    pub(crate) fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    /// A string in as few bytes as its usual shapes allow: a tail of lowercase hex
    /// digits (a runtime's 64-hex ID, an image's `sha256:` digest) as the bytes they
    /// spell, a canonical lowercase UUID (a pod's UID) as its 16 bytes, anything else
    /// as [`Self::str`] would. [`Reader::compact`] gives back exactly the same string.
    /// The header's two low bits say which: [`PLAIN`], [`HEX_TAIL`] or [`UUID`].
    pub(crate) fn compact(&mut self, s: &str) {
        if let Some(bytes) = uuid_bytes(s) {
            self.u64(UUID);
            self.0.extend_from_slice(&bytes);
            return;
        }
        let tail = hex_tail(s);
        if tail < MIN_HEX_TAIL {
            self.u64((s.len() as u64) << 2 | PLAIN);
            self.0.extend_from_slice(s.as_bytes());
            return;
        }
        let (prefix, hex) = s.split_at(s.len() - tail);
        self.u64((prefix.len() as u64) << 2 | HEX_TAIL);
        self.0.extend_from_slice(prefix.as_bytes());
        self.u64((tail / 2) as u64);
        self.0.extend(
            hex.as_bytes()
                .chunks_exact(2)
                .map(|p| nibble(p[0]) << 4 | nibble(p[1])),
        );
    }

    pub(crate) fn time(&mut self, t: SystemTime) {
        let (before, d) = match t.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => (0, d),
            Err(e) => (1, e.duration()),
        };
        self.u8(before);
        self.u64(d.as_secs());
        self.u64(u64::from(d.subsec_nanos()));
    }
}

thread_local! {
    /// Set while a state file of format 1 is read ([`reading_format`]).
    static FORMAT_1: Cell<bool> = const { Cell::new(false) };
    /// Set while bytes of format 1 are decoded ([`format_1_strings`]).
    static FORMAT_1_STRINGS: Cell<bool> = const { Cell::new(false) };
}

fn with_flag<T>(
    flag: &'static std::thread::LocalKey<Cell<bool>>,
    on: bool,
    f: impl FnOnce() -> T,
) -> T {
    struct Restore(&'static std::thread::LocalKey<Cell<bool>>, bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(flag, flag.with(|c| c.replace(on)));
    f()
}

/// Runs `f` reading a state file of format `format`. Format 1 wrote every string of
/// a packed status, reported states and event as [`Writer::str`] does, with no key
/// table and no references: their `from_bytes` decode such bytes that way
/// ([`format_1_strings`]) and pack them anew, so memory only ever holds this build's.
pub(crate) fn reading_format<T>(format: u64, f: impl FnOnce() -> T) -> T {
    with_flag(&FORMAT_1, format == 1, f)
}

/// True inside [`reading_format`] of format 1.
pub(crate) fn format_1() -> bool {
    FORMAT_1.with(Cell::get)
}

/// Runs `f` decoding strings as format 1 wrote them.
pub(crate) fn format_1_strings<T>(f: impl FnOnce() -> T) -> T {
    with_flag(&FORMAT_1_STRINGS, true, f)
}

/// True inside [`format_1_strings`].
pub(crate) fn in_format_1_strings() -> bool {
    FORMAT_1_STRINGS.with(Cell::get)
}

/// Reads values back; every read is None past the end or on a malformed value (only
/// a bug could produce one: nothing but [`Writer`] writes these bytes).
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f).checked_shl(shift)?;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.u64()?).ok()
    }

    pub(crate) fn i64(&mut self) -> Option<i64> {
        let z = self.u64()?;
        Some(((z >> 1) as i64) ^ -((z & 1) as i64))
    }

    pub(crate) fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }

    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.u64()?).ok()?;
        if len > self.0.len() {
            return None;
        }
        let (b, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(b)
    }

    pub(crate) fn string(&mut self) -> Option<String> {
        self.str().map(str::to_owned)
    }

    /// A string written by [`Writer::compact`], appended to `out` (cleared first).
    pub(crate) fn compact_into(&mut self, out: &mut String) -> Option<()> {
        out.clear();
        if in_format_1_strings() {
            out.push_str(self.str()?);
            return Some(());
        }
        let head = self.u64()?;
        let len = usize::try_from(head >> 2).ok()?;
        match head & 3 {
            PLAIN => out.push_str(self.fixed_str(len)?),
            HEX_TAIL => {
                out.push_str(self.fixed_str(len)?);
                let n = usize::try_from(self.u64()?).ok()?;
                for &b in self.fixed(n)? {
                    out.push(HEX[usize::from(b >> 4)] as char);
                    out.push(HEX[usize::from(b & 15)] as char);
                }
            }
            UUID if len == 0 => {
                for (i, &b) in self.fixed(16)?.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        out.push('-');
                    }
                    out.push(HEX[usize::from(b >> 4)] as char);
                    out.push(HEX[usize::from(b & 15)] as char);
                }
            }
            _ => return None,
        }
        Some(())
    }

    /// The bytes of a string written by [`Writer::compact`], as written: two strings
    /// are equal exactly when these are (the encoding depends on the string alone).
    pub(crate) fn compact_raw(&mut self) -> Option<&'a [u8]> {
        let start = self.0;
        if in_format_1_strings() {
            self.str()?;
            return Some(&start[..start.len() - self.0.len()]);
        }
        let head = self.u64()?;
        let len = usize::try_from(head >> 2).ok()?;
        match head & 3 {
            PLAIN => {
                self.fixed(len)?;
            }
            HEX_TAIL => {
                self.fixed(len)?;
                let n = usize::try_from(self.u64()?).ok()?;
                self.fixed(n)?;
            }
            UUID if len == 0 => {
                self.fixed(16)?;
            }
            _ => return None,
        }
        Some(&start[..start.len() - self.0.len()])
    }

    /// A string written by [`Writer::compact`].
    pub(crate) fn compact(&mut self) -> Option<String> {
        let mut s = String::new();
        self.compact_into(&mut s)?;
        Some(s)
    }

    fn fixed(&mut self, len: usize) -> Option<&'a [u8]> {
        if len > self.0.len() {
            return None;
        }
        let (b, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(b)
    }

    fn fixed_str(&mut self, len: usize) -> Option<&'a str> {
        std::str::from_utf8(self.fixed(len)?).ok()
    }

    pub(crate) fn time(&mut self) -> Option<SystemTime> {
        let before = self.u8()?;
        let d = Duration::new(self.u64()?, self.u32()?);
        match before {
            0 => SystemTime::UNIX_EPOCH.checked_add(d),
            1 => SystemTime::UNIX_EPOCH.checked_sub(d),
            _ => None,
        }
    }
}

pub(crate) fn kind_code(kind: EventKind) -> u8 {
    match kind {
        EventKind::ContainerStarted => 0,
        EventKind::ContainerDied => 1,
        EventKind::ContainerRemoved => 2,
        EventKind::PodSync => 3,
        EventKind::ContainerChanged => 4,
    }
}

pub(crate) fn kind_of(code: u8) -> Option<EventKind> {
    Some(match code {
        0 => EventKind::ContainerStarted,
        1 => EventKind::ContainerDied,
        2 => EventKind::ContainerRemoved,
        3 => EventKind::PodSync,
        4 => EventKind::ContainerChanged,
        _ => return None,
    })
}

/// A relist source as one byte: its place in `RelistSource::ALL` (stored in the state dir:
/// new sources go at the end of that list).
pub(crate) fn source_code(source: RelistSource) -> u8 {
    RelistSource::ALL
        .iter()
        .position(|s| *s == source)
        .and_then(|i| u8::try_from(i).ok())
        .unwrap_or(u8::MAX)
}

pub(crate) fn source_of(code: u8) -> Option<RelistSource> {
    RelistSource::ALL.get(usize::from(code)).copied()
}

// Flags of an event.
const SANDBOX: u8 = 1;
const ATTEMPT: u8 = 2;
const IMAGE: u8 = 4;
const EXIT: u8 = 8;
// Flags of an exit.
const REASON: u8 = 1;
const MESSAGE: u8 = 2;
const STARTED: u8 = 4;
const FINISHED: u8 = 8;

/// One event packed into one heap block (see the module docs).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct PackedEvent(Box<[u8]>);

impl std::fmt::Debug for PackedEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PackedEvent")
            .field(&self.revision())
            .finish()
    }
}

impl PackedEvent {
    /// Packs `ev`, using `buf` as scratch (kept by the caller between events, so the
    /// only allocation is the packed block itself).
    pub(crate) fn pack(ev: &LifecycleEvent, buf: &mut Vec<u8>) -> Self {
        Self::pack_into(ev, buf);
        PackedEvent(Box::from(&buf[..]))
    }

    /// Packs `ev` into `buf` (cleared first): the bytes [`Self::pack`] would hold.
    pub(crate) fn pack_into(ev: &LifecycleEvent, buf: &mut Vec<u8>) {
        buf.clear();
        buf.extend_from_slice(&ev.revision.to_le_bytes());
        let mut w = Writer(buf);
        w.time(ev.time);
        w.u8(kind_code(ev.kind));
        w.u8(source_code(ev.relist_source));
        let mut flags = 0;
        for (on, flag) in [
            (ev.sandbox, SANDBOX),
            (ev.attempt.is_some(), ATTEMPT),
            (ev.image.is_some(), IMAGE),
            (ev.exit.is_some(), EXIT),
        ] {
            if on {
                flags |= flag;
            }
        }
        w.u8(flags);
        if let Some(a) = ev.attempt {
            w.u64(u64::from(a));
        }
        w.compact(&ev.pod.uid);
        w.compact(&ev.pod.name);
        w.compact(&ev.pod.namespace);
        w.compact(&ev.container_id);
        w.compact(&ev.container_name);
        if let Some(image) = &ev.image {
            w.compact(image);
        }
        if let Some(exit) = &ev.exit {
            let mut flags = 0;
            for (on, flag) in [
                (exit.reason.is_some(), REASON),
                (exit.message.is_some(), MESSAGE),
                (exit.started_at.is_some(), STARTED),
                (exit.finished_at.is_some(), FINISHED),
            ] {
                if on {
                    flags |= flag;
                }
            }
            w.u8(flags);
            w.i64(i64::from(exit.code));
            for s in [&exit.reason, &exit.message].into_iter().flatten() {
                w.compact(s);
            }
            for t in [exit.started_at, exit.finished_at].into_iter().flatten() {
                w.time(t);
            }
        }
    }

    /// The event's revision, read without unpacking.
    pub(crate) fn revision(&self) -> u64 {
        revision_of(&self.0)
    }

    /// Bytes of heap this event takes (its block).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.0.len()
    }

    /// The packed bytes (what the state dir stores).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Bytes read back from the state dir: None unless they unpack.
    pub(crate) fn from_bytes(b: &[u8]) -> Option<Self> {
        let packed = PackedEvent(Box::from(b));
        if format_1() {
            let event = format_1_strings(|| packed.unpack())?;
            return Some(PackedEvent::pack(&event, &mut Vec::new()));
        }
        packed.unpack().map(|_| packed)
    }

    /// The event as it was packed; None only if the bytes were not written by
    /// [`Self::pack`] (a bug).
    pub(crate) fn unpack(&self) -> Option<LifecycleEvent> {
        unpack(&self.0)
    }
}

/// The revision of an event's packed bytes ([`PackedEvent::pack_into`]'s), read
/// without unpacking.
pub(crate) fn revision_of(packed: &[u8]) -> u64 {
    let mut head = [0u8; 8];
    if let Some(bytes) = packed.get(..8) {
        head.copy_from_slice(bytes);
    }
    u64::from_le_bytes(head)
}

/// An event's packed bytes unpacked: see [`PackedEvent::unpack`].
pub(crate) fn unpack(packed: &[u8]) -> Option<LifecycleEvent> {
    let revision = revision_of(packed);
    let mut r = Reader(packed.get(8..)?);
    let time = r.time()?;
    let kind = kind_of(r.u8()?)?;
    let relist_source = source_of(r.u8()?)?;
    let flags = r.u8()?;
    let attempt = if flags & ATTEMPT != 0 {
        Some(r.u32()?)
    } else {
        None
    };
    let pod = PodRef {
        uid: r.compact()?,
        name: r.compact()?,
        namespace: r.compact()?,
    };
    let container_id = r.compact()?;
    let container_name = r.compact()?;
    let image = if flags & IMAGE != 0 {
        Some(r.compact()?)
    } else {
        None
    };
    let exit = if flags & EXIT != 0 {
        let xf = r.u8()?;
        let code = i32::try_from(r.i64()?).ok()?;
        let reason = if xf & REASON != 0 {
            Some(r.compact()?)
        } else {
            None
        };
        let message = if xf & MESSAGE != 0 {
            Some(r.compact()?)
        } else {
            None
        };
        let started_at = if xf & STARTED != 0 {
            Some(r.time()?)
        } else {
            None
        };
        let finished_at = if xf & FINISHED != 0 {
            Some(r.time()?)
        } else {
            None
        };
        Some(Exit {
            code,
            reason,
            message,
            started_at,
            finished_at,
        })
    } else {
        None
    };
    if !r.0.is_empty() {
        return None;
    }
    Some(LifecycleEvent {
        revision,
        time,
        pod,
        kind,
        container_id,
        relist_source,
        container_name,
        sandbox: flags & SANDBOX != 0,
        attempt,
        image,
        exit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every string comes back exactly as written, whatever its shape, and the usual
    /// shapes take the bytes they spell.
    #[test]
    fn hex_32_packs_exactly_the_ids_of_64_lowercase_hex_digits() {
        for b in 0..=255u8 {
            for at in 0..64 {
                let mut id = vec![b'7'; 64];
                id[at] = b;
                let Ok(id) = String::from_utf8(id) else {
                    continue;
                };
                let packed = hex_32(&id);
                assert_eq!(packed.is_some(), is_hex(b), "{b:#x} at {at}");
                if let Some(bytes) = packed {
                    let mut spelled = [0u8; 64];
                    spell_hex(&bytes, &mut spelled);
                    assert_eq!(&spelled[..], id.as_bytes());
                }
            }
        }
        // Every digit in every place, and a multi-byte character in one.
        let all: String = HEX
            .iter()
            .cycle()
            .take(64)
            .map(|&b| char::from(b))
            .collect();
        let mut spelled = [0u8; 64];
        spell_hex(&hex_32(&all).unwrap(), &mut spelled);
        assert_eq!(&spelled[..], all.as_bytes());
        assert_eq!(hex_32(&format!("é{}", &all[2..])), None);
        assert_eq!(hex_32(&"a".repeat(63)), None);
        assert_eq!(hex_32(&"a".repeat(65)), None);
    }

    #[test]
    fn a_compact_string_comes_back_exactly() {
        let id = "0123456789abcdef".repeat(4);
        let strings = [
            String::new(),
            "a".into(),
            "ünïcødé".into(),
            id.clone(),
            format!("sha256:{id}"),
            // An odd hex tail: one digit stays in the prefix.
            format!("x{}", &id[..63]),
            id[..63].to_string(),
            // Uppercase hex is not this shape: kept as it is.
            id.to_uppercase(),
            format!("{}A", &id[..62]),
            // Short hex tails are kept as they are.
            "deadbeef".into(),
            "app-7f9c6d5b8d".into(),
            "0000002a-0000-4000-8000-00000000002a".into(),
            "0000002A-0000-4000-8000-00000000002a".into(),
            "0000002a-0000-4000-8000_00000000002a".into(),
            "0000002a-0000-4000-8000-00000000002g".into(),
            "0000002a00000-4000-8000-00000000002a".into(),
            "x".repeat(300),
        ];
        let mut buf = Vec::new();
        for s in &strings {
            Writer(&mut buf).compact(s);
        }
        let mut r = Reader(&buf);
        for s in &strings {
            assert_eq!(r.compact().as_deref(), Some(s.as_str()));
        }
        assert!(r.0.is_empty());
        let size = |s: &str| {
            let mut b = Vec::new();
            Writer(&mut b).compact(s);
            b.len()
        };
        assert_eq!(size(&id), 2 + 32);
        assert_eq!(size(&format!("sha256:{id}")), 2 + 7 + 32);
        assert_eq!(size("0000002a-0000-4000-8000-00000000002a"), 1 + 16);
        assert_eq!(size("app"), 1 + 3);
        // Truncated bytes read as None, never a panic.
        let mut b = Vec::new();
        Writer(&mut b).compact(&format!("sha256:{id}"));
        for len in 0..b.len() {
            assert_eq!(Reader(&b[..len]).compact(), None, "{len}");
        }
    }

    fn event() -> LifecycleEvent {
        LifecycleEvent {
            revision: 7,
            time: SystemTime::UNIX_EPOCH + Duration::new(1_764_000_000, 123_456_789),
            pod: PodRef {
                uid: "0000002a-0000-4000-8000-00000000002a".into(),
                name: "web-1".into(),
                namespace: "default".into(),
            },
            kind: EventKind::ContainerStarted,
            container_id: "c".repeat(64),
            relist_source: RelistSource::EventedPleg,
            container_name: "app".into(),
            sandbox: false,
            attempt: Some(3),
            image: Some("registry.example/app:1.2".into()),
            exit: None,
        }
    }

    fn round_trip(ev: &LifecycleEvent) {
        let mut buf = Vec::new();
        let packed = PackedEvent::pack(ev, &mut buf);
        assert_eq!(packed.revision(), ev.revision);
        assert_eq!(packed.unpack().as_ref(), Some(ev));
    }

    #[test]
    fn every_field_of_every_kind_of_event_comes_back_as_it_was_packed() {
        let mut ev = event();
        round_trip(&ev);
        for kind in [
            EventKind::ContainerStarted,
            EventKind::ContainerDied,
            EventKind::ContainerRemoved,
            EventKind::PodSync,
            EventKind::ContainerChanged,
        ] {
            for &source in RelistSource::ALL {
                ev.kind = kind;
                ev.relist_source = source;
                round_trip(&ev);
            }
        }
        // A sandbox, no attempt or image, empty strings, extreme numbers.
        ev.sandbox = true;
        ev.attempt = None;
        ev.image = None;
        ev.container_name = String::new();
        ev.revision = u64::MAX;
        round_trip(&ev);
        ev.attempt = Some(u32::MAX);
        ev.pod.name = "ünïcødé ✓".into();
        round_trip(&ev);
        // Every combination of exit details, negative and extreme codes, times before
        // the epoch.
        let before = SystemTime::UNIX_EPOCH - Duration::new(5, 1);
        for bits in 0..16u8 {
            for code in [0, 1, 137, -1, i32::MIN, i32::MAX] {
                ev.exit = Some(Exit {
                    code,
                    reason: (bits & 1 != 0).then(|| "OOMKilled".to_string()),
                    message: (bits & 2 != 0).then(String::new),
                    started_at: (bits & 4 != 0).then_some(before),
                    finished_at: (bits & 8 != 0).then_some(ev.time),
                });
                round_trip(&ev);
            }
        }
        ev.time = before;
        round_trip(&ev);
    }

    #[test]
    fn a_packed_event_is_a_fraction_of_the_struct() {
        let mut buf = Vec::new();
        let packed = PackedEvent::pack(&event(), &mut buf);
        // 36 + 5 + 7 + 64 + 3 + 24 bytes of strings, and 30 or so of the rest.
        assert!(packed.heap_bytes() < 180, "{} bytes", packed.heap_bytes());
    }

    #[test]
    fn truncated_or_garbled_bytes_unpack_to_none_never_a_panic() {
        let mut buf = Vec::new();
        let mut ev = event();
        ev.exit = Some(Exit {
            code: -3,
            reason: Some("Error".into()),
            message: Some("boom".into()),
            started_at: Some(ev.time),
            finished_at: Some(ev.time),
        });
        let bytes = PackedEvent::pack(&ev, &mut buf).0.into_vec();
        for len in 0..bytes.len() {
            assert_eq!(PackedEvent(bytes[..len].into()).unpack(), None, "{len}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(PackedEvent(longer.into()).unpack(), None);
        for i in 8..bytes.len() {
            let mut garbled = bytes.clone();
            garbled[i] = 0xff;
            // Decodes to something or to None; never panics.
            let _ = PackedEvent(garbled.into()).unpack();
        }
    }
}
