//! What the wire readers' tests share: a seeded generator of field values, unknown
//! fields, shuffled fields and broken bytes. Each reader is checked against prost's
//! decoding on the same generated and mangled messages.

use std::collections::HashMap;

use prost::encoding::{encode_key, WireType};
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
