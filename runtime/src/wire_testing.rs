//! What the wire readers' tests share: a seeded generator of field values, unknown
//! fields, shuffled fields and broken bytes. Each reader is checked against prost's
//! decoding on the same generated and mangled messages.

use std::collections::HashMap;

use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;
use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;

/// The tests' seeded generator (ChaCha8, as every seeded test in the tree): the
/// same draws on every run.
pub(crate) struct Rng(ChaCha8Rng);
impl Rng {
    pub(crate) fn seeded(seed: u64) -> Rng {
        Rng(ChaCha8Rng::seed_from_u64(seed))
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0.random_range(0..n)
    }
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub(crate) fn text(&mut self) -> String {
        const WORDS: [&str; 7] = ["", "a", "web", "io.kubernetes.pod.name", "ü", "x y", "0"];
        let mut s = String::new();
        for _ in 0..self.below(3) {
            s.push_str(WORDS[self.below(WORDS.len() as u64) as usize]);
        }
        s
    }
    pub(crate) fn varint_value(&mut self) -> u64 {
        match self.below(4) {
            0 => 0,
            1 => self.below(5),
            2 => u64::MAX - self.below(3),
            _ => self.below(1 << 40),
        }
    }
    pub(crate) fn map(&mut self) -> HashMap<String, String> {
        (0..self.below(4))
            .map(|_| (self.text(), self.text()))
            .collect()
    }
    /// An image spec with every field CRI defines.
    pub(crate) fn image_spec(&mut self) -> crate::cri::ImageSpec {
        crate::cri::ImageSpec {
            image: self.text(),
            annotations: self.map(),
            user_specified_image: self.text(),
            runtime_handler: self.text(),
        }
    }
}

/// An unknown field (a tag the message does not define) of any wire type, groups
/// (nested) included.
pub(crate) fn unknown_field(rng: &mut Rng, depth: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let tag = [11, 15, 20, 99, 536_870_911][rng.below(5) as usize];
    match rng.below(if depth > 0 { 5 } else { 4 }) {
        0 => {
            encode_key(tag, WireType::Varint, &mut out);
            prost::encoding::encode_varint(rng.varint_value(), &mut out);
        }
        1 => {
            encode_key(tag, WireType::ThirtyTwoBit, &mut out);
            out.extend([1, 2, 3, 4]);
        }
        2 => {
            encode_key(tag, WireType::SixtyFourBit, &mut out);
            out.extend([0xff; 8]);
        }
        3 => {
            encode_key(tag, WireType::LengthDelimited, &mut out);
            let body = rng.text().into_bytes();
            prost::encoding::encode_varint(body.len() as u64, &mut out);
            out.extend(body);
        }
        _ => {
            encode_key(tag, WireType::StartGroup, &mut out);
            for _ in 0..rng.below(3) {
                out.extend(unknown_field(rng, depth - 1));
            }
            encode_key(tag, WireType::EndGroup, &mut out);
        }
    }
    out
}

/// One entry: its fields shuffled, with unknown fields among them.
pub(crate) fn entry(rng: &mut Rng, mut fields: Vec<Vec<u8>>) -> Vec<u8> {
    for _ in 0..rng.below(3) {
        let at = rng.below(fields.len() as u64 + 1) as usize;
        fields.insert(at, unknown_field(rng, 3));
    }
    for i in (1..fields.len()).rev() {
        fields.swap(i, rng.below(i as u64 + 1) as usize);
    }
    fields.concat()
}

/// Breaks the bytes in one of several ways (or leaves them alone).
pub(crate) fn mangle(rng: &mut Rng, mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.is_empty() {
        return bytes;
    }
    let at = rng.below(bytes.len() as u64) as usize;
    match rng.below(8) {
        0 => bytes.truncate(at),
        1 => bytes[at] ^= 1 << rng.below(8),
        2 => bytes[at] = 0xff,
        3 => bytes.insert(at, rng.below(256) as u8),
        // A key byte for "tag 5 / tag 8, varint" (a map field of the wrong wire
        // type) or "end group" (a stray group end).
        4 => bytes.insert(at, [0x28, 0x40, 0x0c, 0x80][rng.below(4) as usize]),
        5 => bytes[at] = 0xc3, // a UTF-8 lead byte alone
        _ => {}
    }
    bytes
}

/// An embedded message's fields (each encoded as a message of its own) as one or two
/// occurrences of field `tag` (prost merges them), each with its fields shuffled and
/// unknown fields among them; at times none when it has no field.
pub(crate) fn embedded(rng: &mut Rng, tag: u32, mut fields: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let at = rng.below(fields.len() as u64 + 1) as usize;
    let second = fields.split_off(at);
    let mut parts = Vec::new();
    for group in [fields, second] {
        if group.is_empty() && rng.chance(50) {
            continue;
        }
        let body = entry(rng, group);
        let mut out = Vec::new();
        encode_key(tag, WireType::LengthDelimited, &mut out);
        encode_varint(body.len() as u64, &mut out);
        out.extend(body);
        parts.push(out);
    }
    parts
}

/// A message's parts (fields, or runs of them) in any order, an unknown field at
/// times among them.
pub(crate) fn shuffled(rng: &mut Rng, mut parts: Vec<Vec<u8>>) -> Vec<u8> {
    for _ in 0..rng.below(2) {
        parts.push(unknown_field(rng, 3));
    }
    for i in (1..parts.len()).rev() {
        parts.swap(i, rng.below(i as u64 + 1) as usize);
    }
    parts.concat()
}

/// A reader of some of a message's fields (prost messages that declare only those)
/// against prost's decoding of the whole message, on the same bytes: what prost
/// reads, the reader reads the same; what prost accepts, the reader accepts.
#[derive(Debug, Default)]
pub(crate) struct AgainstProst {
    read_alike: u32,
    both_refuse: u32,
    only_prost_refuses: u32,
}

impl AgainstProst {
    /// Decodes `bytes` both ways: `whole` (prost's message as the reader must read
    /// it) and `read` (the reader's) must agree.
    pub(crate) fn check<W, R, T>(
        &mut self,
        bytes: &[u8],
        whole: impl FnOnce(W) -> T,
        read: impl FnOnce(R) -> T,
    ) where
        W: Message + Default,
        R: Message + Default,
        T: PartialEq + std::fmt::Debug,
    {
        match (W::decode(bytes), R::decode(bytes)) {
            (Ok(w), Ok(r)) => {
                assert_eq!(read(r), whole(w), "{bytes:?}");
                self.read_alike += 1;
            }
            (Err(_), Err(_)) => self.both_refuse += 1,
            (Err(_), Ok(_)) => self.only_prost_refuses += 1,
            (Ok(w), Err(e)) => panic!(
                "prost read {:?}, the reader refused: {e}\n{bytes:?}",
                whole(w)
            ),
        }
    }

    /// Each outcome came at least this often: the run tried them all.
    pub(crate) fn assert_at_least(
        &self,
        read_alike: u32,
        both_refuse: u32,
        only_prost_refuses: u32,
    ) {
        assert!(
            self.read_alike >= read_alike
                && self.both_refuse >= both_refuse
                && self.only_prost_refuses >= only_prost_refuses,
            "{self:?}"
        );
    }
}
