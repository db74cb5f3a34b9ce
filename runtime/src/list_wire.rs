//! A reader of the ListPodSandbox and ListContainers responses straight from their
//! protobuf bytes, for the global relist: it borrows the fields plegd uses
//! (IDs, the pod's identity, states) and only checks the rest — labels, annotations,
//! the image spec — instead of decoding every field of every entry into owned strings
//! and hash maps that a relist where nothing changed throws away.
//!
//! It accepts exactly what prost's decoding of `cri::ListPodSandboxResponse` and
//! `cri::ListContainersResponse` accepts, and reads the same values: the last value
//! of a scalar field wins, a repeated embedded message merges into the first, every
//! string (skipped ones included) must be UTF-8, every known field must have its wire
//! type, unknown fields (groups included) are skipped, and prost's recursion limit
//! holds. The tests check it against prost on generated and
//! mangled messages.
//!
//! With a [`ListMemo`] (the global relist's), every entry is first read lightly: the
//! fields plegd uses are read and checked as above, the others skipped by their
//! length unchecked and hashed (a container's labels and annotations skipped
//! unhashed); an entry whose fields (a sandbox's labels and annotations in any order)
//! are those of an entry fully checked in the last good read is not checked further,
//! any other is then fully checked. So for entries seen before, "accepts exactly what
//! prost accepts" becomes "reads exactly what prost reads, and accepts what prost
//! accepted before" — for a container, before with the same other fields: CRI sets
//! its labels and annotations when it creates it, and plegd reads neither. See
//! [`crate::list_memo`] for why a hash collision can never hide a change plegd reads.

use std::collections::BTreeMap;

use prost::encoding::{decode_key, decode_varint, WireType};

use crate::list_memo::{EntryMemo, Fingerprint, Known, ListMemo};

/// Why bytes are not a valid message (what prost would have refused).
pub type WireError = String;
type Res<T> = Result<T, WireError>;

/// prost's recursion budget at the top of a message (`prost::RECURSION_LIMIT`).
const RECURSION_LIMIT: u32 = 100;

/// A sandbox entry of ListPodSandbox, borrowed from the response's bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SandboxFields<'a> {
    pub id: &'a str,
    /// Whether the entry had a `metadata` field at all.
    pub has_metadata: bool,
    pub uid: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub attempt: u32,
    pub state: i32,
    pub created_at: i64,
}

/// A container entry of ListContainers, borrowed from the response's bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContainerFields<'a> {
    pub id: &'a str,
    pub sandbox_id: &'a str,
    pub name: &'a str,
    pub attempt: u32,
    pub state: i32,
    pub created_at: i64,
}

fn err(what: &str) -> WireError {
    what.to_string()
}

/// A field's key; keys of one byte (tags up to 15) without prost's general path.
#[inline(always)]
fn key(buf: &mut &[u8]) -> Res<(u32, WireType)> {
    if let Some((&b, rest)) = buf.split_first() {
        let wire_type = match b & 7 {
            0 => Some(WireType::Varint),
            1 => Some(WireType::SixtyFourBit),
            2 => Some(WireType::LengthDelimited),
            3 => Some(WireType::StartGroup),
            4 => Some(WireType::EndGroup),
            5 => Some(WireType::ThirtyTwoBit),
            _ => None,
        };
        if let (true, Some(wire_type)) = (b < 0x80 && b >> 3 != 0, wire_type) {
            *buf = rest;
            return Ok((u32::from(b >> 3), wire_type));
        }
    }
    decode_key(buf).map_err(|e| e.to_string())
}

/// A varint; values of one or two bytes (lengths under 16 KiB) without prost's
/// general path.
#[inline(always)]
fn varint(buf: &mut &[u8]) -> Res<u64> {
    match **buf {
        [b, ..] if b < 0x80 => {
            *buf = &buf[1..];
            Ok(u64::from(b))
        }
        [b0, b1, ..] if b1 < 0x80 => {
            *buf = &buf[2..];
            Ok(u64::from(b0 & 0x7f) | u64::from(b1) << 7)
        }
        _ => long_varint(buf),
    }
}

/// A varint of more than two bytes: of up to 9 (a time in nanoseconds) with 9 bytes
/// in view, its 7-bit groups gathered from one word (half the instructions of
/// prost's general path); any other by prost.
#[inline(never)]
fn long_varint(buf: &mut &[u8]) -> Res<u64> {
    if let Some((word, [b8, ..])) = buf.split_first_chunk::<8>() {
        let word = u64::from_le_bytes(*word);
        let ends = !word & 0x8080_8080_8080_8080;
        if ends != 0 || *b8 < 0x80 {
            let (len, top) = match ends {
                0 => (9, u64::from(*b8) << 56),
                _ => (ends.trailing_zeros() as usize / 8 + 1, 0),
            };
            let mut v = match len {
                8.. => word,
                _ => word & ((1 << (8 * len)) - 1),
            } & 0x7f7f_7f7f_7f7f_7f7f;
            v = (v & 0x007f_007f_007f_007f) | (v & 0x7f00_7f00_7f00_7f00) >> 1;
            v = (v & 0x0000_3fff_0000_3fff) | (v & 0x3fff_0000_3fff_0000) >> 2;
            v = (v & 0x0000_0000_0fff_ffff) | (v & 0x0fff_ffff_0000_0000) >> 4;
            *buf = &buf[len..];
            return Ok(v | top);
        }
    }
    decode_varint(buf).map_err(|e| e.to_string())
}

#[inline(always)]
fn expect(want: WireType, got: WireType) -> Res<()> {
    if want == got {
        Ok(())
    } else {
        Err(format!("invalid wire type: {got:?} (expected {want:?})"))
    }
}

/// A length-delimited payload (the length is read whatever `wire_type` says: callers
/// check it first where prost does).
#[inline(always)]
fn delimited<'a>(buf: &mut &'a [u8]) -> Res<&'a [u8]> {
    let len = varint(buf)?;
    if len > buf.len() as u64 {
        return Err(err("buffer underflow"));
    }
    let (head, rest) = buf.split_at(len as usize);
    *buf = rest;
    Ok(head)
}

#[inline(always)]
fn string<'a>(wire_type: WireType, buf: &mut &'a [u8]) -> Res<&'a str> {
    expect(WireType::LengthDelimited, wire_type)?;
    let bytes = delimited(buf)?;
    // What kubelet and containerd name things with is ASCII (IDs, UIDs, names,
    // namespaces), valid UTF-8 whose check needs no more than each byte's high bit:
    // a third of the cost of a general check on strings this short. Anything else,
    // by simdutf8, which accepts exactly what std's (prost's) check accepts.
    match ascii::AsciiStr::from_ascii(bytes) {
        Ok(s) => Ok(s.as_str()),
        Err(_) => simdutf8::basic::from_utf8(bytes)
            .map_err(|_| err("invalid string value: data is not UTF-8 encoded")),
    }
}

#[inline(always)]
fn int(wire_type: WireType, buf: &mut &[u8]) -> Res<u64> {
    expect(WireType::Varint, wire_type)?;
    varint(buf)
}

/// prost's `skip_field`, with its recursion budget `depth`; a length-delimited field
/// (most of what a light read skips: labels, annotations) without a call.
#[inline(always)]
fn skip(wire_type: WireType, tag: u32, buf: &mut &[u8], depth: u32) -> Res<()> {
    if wire_type == WireType::LengthDelimited && depth != 0 {
        delimited(buf)?;
        return Ok(());
    }
    skip_any(wire_type, tag, buf, depth)
}

/// The tag and the length (key and value) of the first field of `buf` (not empty),
/// checked as [`key`] and [`skip`] check it. The usual fields (a length-delimited one
/// of a length under 16 KiB, a varint of up to 9 bytes, with a one-byte key) are
/// measured without a call: a light read's loop is most of a no-change relist.
#[inline(always)]
fn field_len(buf: &[u8], depth: u32) -> Res<(u32, usize)> {
    if let ([b0 @ 0x08..=0x7f, rest @ ..], true) = (buf, depth != 0) {
        let len = match (b0 & 7, rest) {
            (2, [l0 @ 0..=0x7f, ..]) => Some(2 + usize::from(*l0)),
            (2, [l0, l1 @ 0..=0x7f, ..]) => {
                Some(3 + (usize::from(l0 & 0x7f) | usize::from(*l1) << 7))
            }
            (0, [0..=0x7f, ..]) => Some(2),
            // Longer (a time in nanoseconds: 9 bytes), with 9 bytes in view: the first
            // byte without the continuation bit ends it.
            (0, _) => rest.first_chunk::<9>().and_then(|bytes| {
                let (word, last) = bytes.split_first_chunk::<8>()?;
                match !u64::from_le_bytes(*word) & 0x8080_8080_8080_8080 {
                    0 => (last[0] < 0x80).then_some(10),
                    ends => Some(2 + (ends.trailing_zeros() / 8) as usize),
                }
            }),
            _ => None,
        };
        if let Some(len) = len.filter(|&len| len <= buf.len()) {
            return Ok((u32::from(b0 >> 3), len));
        }
    }
    field_len_slow(buf, depth)
}

#[cold]
#[inline(never)]
fn field_len_slow(buf: &[u8], depth: u32) -> Res<(u32, usize)> {
    let mut rest = buf;
    let (tag, wire_type) = key(&mut rest)?;
    skip(wire_type, tag, &mut rest, depth)?;
    Ok((tag, buf.len() - rest.len()))
}

fn skip_any(wire_type: WireType, tag: u32, buf: &mut &[u8], depth: u32) -> Res<()> {
    if depth == 0 {
        return Err(err("recursion limit reached"));
    }
    let len = match wire_type {
        WireType::Varint => varint(buf).map(|_| 0)?,
        WireType::ThirtyTwoBit => 4,
        WireType::SixtyFourBit => 8,
        WireType::LengthDelimited => varint(buf)?,
        WireType::StartGroup => loop {
            let (inner_tag, inner_type) = key(buf)?;
            match inner_type {
                WireType::EndGroup if inner_tag != tag => {
                    return Err(err("unexpected end group tag"))
                }
                WireType::EndGroup => break 0,
                _ => skip(inner_type, inner_tag, buf, depth - 1)?,
            }
        },
        WireType::EndGroup => return Err(err("unexpected end group tag")),
    };
    if len > buf.len() as u64 {
        return Err(err("buffer underflow"));
    }
    *buf = &buf[len as usize..];
    Ok(())
}

/// An embedded message field: checked as prost's `message::merge` does; returns its
/// bytes, to be read with the budget `depth - 1`.
#[inline(always)]
fn message<'a>(wire_type: WireType, buf: &mut &'a [u8], depth: u32) -> Res<&'a [u8]> {
    expect(WireType::LengthDelimited, wire_type)?;
    if depth == 0 {
        return Err(err("recursion limit reached"));
    }
    delimited(buf)
}

/// A `map<string, string>` field: every entry is checked; with `into`, inserted in
/// order (the last key wins).
fn string_map(
    wire_type: WireType,
    buf: &mut &[u8],
    depth: u32,
    into: Option<&mut BTreeMap<String, String>>,
) -> Res<()> {
    expect(WireType::LengthDelimited, wire_type)?;
    if depth == 0 {
        return Err(err("recursion limit reached"));
    }
    let (k, v) = map_entry(delimited(buf)?, depth)?;
    if let Some(map) = into {
        map.insert(k.to_string(), v.to_string());
    }
    Ok(())
}

/// A `map<string, string>` entry's bytes: its key and value.
fn map_entry(mut entry: &[u8], depth: u32) -> Res<(&str, &str)> {
    let (mut k, mut v) = ("", "");
    while !entry.is_empty() {
        match key(&mut entry)? {
            (1, wt) => k = string(wt, &mut entry)?,
            (2, wt) => v = string(wt, &mut entry)?,
            (tag, wt) => skip(wt, tag, &mut entry, depth - 1)?,
        }
    }
    Ok((k, v))
}

/// The entries (field 1, each an embedded message) of a list response, each with the
/// recursion budget it is read with; unknown fields are checked and skipped.
fn entries<'a>(mut buf: &'a [u8], mut each: impl FnMut(&'a [u8], u32) -> Res<()>) -> Res<()> {
    while !buf.is_empty() {
        match key(&mut buf)? {
            (1, wt) => {
                let entry = message(wt, &mut buf, RECURSION_LIMIT)?;
                each(entry, RECURSION_LIMIT - 1)?;
            }
            (tag, wt) => skip(wt, tag, &mut buf, RECURSION_LIMIT)?,
        }
    }
    Ok(())
}

/// Reads `cri::PodSandbox` bytes (with the budget `depth`); its labels into `labels`
/// when given.
pub fn sandbox_fields<'a>(
    buf: &'a [u8],
    depth: u32,
    labels: Option<&mut BTreeMap<String, String>>,
) -> Res<SandboxFields<'a>> {
    sandbox_read(buf, depth, labels)
}

/// Reads a field of `cri::PodSandbox` that plegd reads (tags 1 to 4: ID, metadata,
/// state, creation time) into `f`, after its key; false for any other field (left
/// unread).
#[inline(always)]
fn sandbox_field<'a>(
    f: &mut SandboxFields<'a>,
    (tag, wt): (u32, WireType),
    buf: &mut &'a [u8],
    depth: u32,
) -> Res<bool> {
    match tag {
        // Its ID counts in its fingerprint, as every field of a sandbox does: an entry the memo
        // vouches for is a sandbox read in full before, whose labels plegd has
        // read (`crate::packed_lists`), never a new sandbox alike.
        1 => f.id = string(wt, buf)?,
        2 => {
            let mut meta = message(wt, buf, depth)?;
            f.has_metadata = true;
            while !meta.is_empty() {
                match key(&mut meta)? {
                    (1, wt) => f.name = string(wt, &mut meta)?,
                    (2, wt) => f.uid = string(wt, &mut meta)?,
                    (3, wt) => f.namespace = string(wt, &mut meta)?,
                    (4, wt) => f.attempt = int(wt, &mut meta)? as u32,
                    (tag, wt) => skip(wt, tag, &mut meta, depth - 1)?,
                }
            }
        }
        3 => f.state = int(wt, buf)? as i32,
        4 => f.created_at = int(wt, buf)? as i64,
        _ => return Ok(false),
    }
    Ok(true)
}

/// Reads `cri::PodSandbox` bytes, every field checked; its labels into `labels`
/// when given.
#[inline(always)]
fn sandbox_read<'a>(
    buf: &'a [u8],
    depth: u32,
    mut labels: Option<&mut BTreeMap<String, String>>,
) -> Res<SandboxFields<'a>> {
    full_read(buf, depth, sandbox_field, |key, buf| match key {
        (5, wt) => string_map(wt, buf, depth, labels.as_deref_mut()),
        (6, wt) => string_map(wt, buf, depth, None),
        (7, wt) => string(wt, buf).map(drop),
        (tag, wt) => skip(wt, tag, buf, depth),
    })
}

/// Reads an entry in full: the fields plegd reads by `read`, every other field
/// checked by `other`, after its key.
#[inline(always)]
fn full_read<'a, F: Default>(
    mut buf: &'a [u8],
    depth: u32,
    read: impl Fn(&mut F, (u32, WireType), &mut &'a [u8], u32) -> Res<bool>,
    mut other: impl FnMut((u32, WireType), &mut &'a [u8]) -> Res<()>,
) -> Res<F> {
    let mut f = F::default();
    while !buf.is_empty() {
        let key = key(&mut buf)?;
        if !read(&mut f, key, &mut buf, depth)? {
            other(key, &mut buf)?;
        }
    }
    Ok(f)
}

/// Reads `cri::ImageSpec` bytes (checked only: plegd takes no field of it).
fn image_spec(mut buf: &[u8], depth: u32) -> Res<()> {
    while !buf.is_empty() {
        match key(&mut buf)? {
            (1 | 18 | 19, wt) => {
                string(wt, &mut buf)?;
            }
            (2, wt) => string_map(wt, &mut buf, depth, None)?,
            (tag, wt) => skip(wt, tag, &mut buf, depth)?,
        }
    }
    Ok(())
}

/// Reads `cri::Container` bytes (with the budget `depth`).
pub fn container_fields(buf: &[u8], depth: u32) -> Res<ContainerFields<'_>> {
    container_read(buf, depth)
}

/// Reads a field of `cri::Container` that plegd reads (tags 1, 2, 3, 6, 7: IDs,
/// metadata, state, creation time) into `f`, after its key; false for any other
/// field (left unread).
#[inline(always)]
fn container_field<'a>(
    f: &mut ContainerFields<'a>,
    (tag, wt): (u32, WireType),
    buf: &mut &'a [u8],
    depth: u32,
) -> Res<bool> {
    match tag {
        1 => f.id = string(wt, buf)?,
        2 => f.sandbox_id = string(wt, buf)?,
        3 => {
            let mut meta = message(wt, buf, depth)?;
            while !meta.is_empty() {
                match key(&mut meta)? {
                    (1, wt) => f.name = string(wt, &mut meta)?,
                    (2, wt) => f.attempt = int(wt, &mut meta)? as u32,
                    (tag, wt) => skip(wt, tag, &mut meta, depth - 1)?,
                }
            }
        }
        6 => f.state = int(wt, buf)? as i32,
        7 => f.created_at = int(wt, buf)? as i64,
        _ => return Ok(false),
    }
    Ok(true)
}

/// Reads `cri::Container` bytes, every field checked.
#[inline(always)]
fn container_read(buf: &[u8], depth: u32) -> Res<ContainerFields<'_>> {
    full_read(buf, depth, container_field, |key, buf| match key {
        (4, wt) => image_spec(message(wt, buf, depth)?, depth - 1),
        (5 | 10, wt) => string(wt, buf).map(drop),
        (8 | 9, wt) => string_map(wt, buf, depth, None),
        (tag, wt) => skip(wt, tag, buf, depth),
    })
}

/// An entry's fields as a light read meets them: those plegd reads, by tag (bit n:
/// tag n), its two map fields (labels and annotations), by tag, and whether those
/// count in its fingerprint.
struct Light {
    /// The tag of the entry's ID (where the memo keeps it).
    id: u32,
    reads: u32,
    maps: [u32; 2],
    hash_maps: bool,
}

/// plegd keeps a sandbox's labels: its map fields count.
const SANDBOX_LIGHT: Light = Light {
    id: 1,
    reads: 1 << 1 | 1 << 2 | 1 << 3 | 1 << 4,
    maps: [5, 6],
    hash_maps: true,
};
/// plegd keeps none of a container's map fields, and CRI sets them when it creates
/// the container: they are checked when the memo first meets the container's other
/// fields, not hashed on every read (most of a kubelet container's bytes).
const CONTAINER_LIGHT: Light = Light {
    id: 1,
    reads: 1 << 1 | 1 << 2 | 1 << 3 | 1 << 6 | 1 << 7,
    maps: [8, 9],
    hash_maps: false,
};

/// Reads an entry lightly: only the fields plegd reads are read (by `read`) and
/// checked, the others measured by their length. Each map field (a label, an
/// annotation: Go marshals them in random order) is added to `fp` on its own (if
/// `kind.hash_maps`), each run of the other fields between them as one part.
#[inline(always)]
fn light_read<'a, F: Default>(
    mut buf: &'a [u8],
    depth: u32,
    fp: &mut Fingerprint<'_>,
    kind: &Light,
    read: impl Fn(&mut F, (u32, WireType), &mut &'a [u8], u32) -> Res<bool>,
) -> Res<F> {
    let mut f = F::default();
    let mut run = buf;
    while !buf.is_empty() {
        let (tag, len) = field_len(buf, depth)?;
        let (field, rest) = buf.split_at(len);
        if kind.maps.contains(&tag) {
            if run.len() != buf.len() {
                fp.field(&run[..run.len() - buf.len()]);
            }
            if kind.hash_maps {
                fp.field(field);
            }
            run = rest;
        } else if tag < 32 && kind.reads & 1 << tag != 0 {
            if tag == kind.id {
                fp.id(field);
            }
            let mut value = field;
            read(&mut f, key(&mut value)?, &mut value, depth)?;
            fp.note_read(tag);
        }
        buf = rest;
    }
    if !run.is_empty() {
        fp.field(run);
    }
    Ok(f)
}

/// An entry read with `memo`: lightly (`read(Some(fingerprint))`), and if the memo
/// does not hold its fingerprint, then fully (`read(None)`) and remembered. (A light
/// read checks a part of what a full one checks: when it fails, so would the full
/// one, which is done to fail with prost's error.) Also whether it was read fully.
/// An entry whose fingerprint leaves its map fields out (`kind`) and that an entry
/// earlier in the same read shares is read fully too: the two may differ there, and
/// the read has met neither before (a read with a fresh memo accepts exactly what
/// prost accepts).
#[inline(always)]
fn memoized<T>(
    memo: Option<&mut EntryMemo>,
    kind: &Light,
    read: impl Fn(Option<&mut Fingerprint<'_>>) -> Res<T>,
    rememberable: impl Fn() -> bool,
) -> Res<(T, bool)> {
    let Some(memo) = memo else {
        return Ok((read(None)?, true));
    };
    memo.count_entry();
    let mut fp = memo.fingerprint();
    let light = read(Some(&mut fp));
    let key = fp.key();
    if let (Ok(fields), Some(key)) = (light, key) {
        match (memo.knows(key), kind.hash_maps) {
            (Known::LastRead, _) | (Known::ThisRead, true) => return Ok((fields, false)),
            (Known::ThisRead, false) => return Ok((read(None)?, true)),
            (Known::No, _) => {}
        }
        let fields = read(None)?;
        if rememberable() {
            memo.add(key);
        }
        return Ok((fields, true));
    }
    Ok((read(None)?, true))
}

/// Every sandbox of a `ListPodSandboxResponse`, with its entry's bytes (to read its
/// labels later), in order — or why prost would refuse the response.
pub fn sandboxes<'a>(buf: &'a [u8], each: impl FnMut(SandboxFields<'a>, &'a [u8])) -> Res<()> {
    sandboxes_memo(buf, None, each)
}

/// [`sandboxes`], the entries a memo vouches for read lightly (the memo's
/// `sandboxes`; the caller ends the read with [`ListMemo::finish`]).
pub(crate) fn sandboxes_memo<'a>(
    buf: &'a [u8],
    mut memo: Option<&mut ListMemo>,
    mut each: impl FnMut(SandboxFields<'a>, &'a [u8]),
) -> Res<()> {
    entries(buf, |entry, _| {
        let (fields, _) = sandbox_entry(entry, memo.as_deref_mut().map(|m| &mut m.sandboxes))?;
        each(fields, entry);
        Ok(())
    })
}

/// One sandbox entry of a list, read as [`sandboxes_memo`] reads it (the memo: its
/// sandboxes part); and whether it was checked in full (the memo did not vouch for
/// it).
pub(crate) fn sandbox_entry<'a>(
    entry: &'a [u8],
    memo: Option<&mut EntryMemo>,
) -> Res<(SandboxFields<'a>, bool)> {
    let depth = RECURSION_LIMIT - 1;
    let read = |fp: Option<&mut Fingerprint<'_>>| match fp {
        None => sandbox_read(entry, depth, None),
        // A closure, not the fn item: its call is inlined (the fn item's was not, 5 %
        // of a no-change relist's instructions).
        Some(fp) => light_read(entry, depth, fp, &SANDBOX_LIGHT, |f, k, b, d| {
            sandbox_field(f, k, b, d)
        }),
    };
    memoized(memo, &SANDBOX_LIGHT, read, || {
        labels_name_each_key_once(entry)
    })
}

/// Whether no two label fields of a sandbox entry (read in full) name one key. The
/// last field of a key gives its value, so the same fields in another order would be
/// other labels with the same fingerprint: such an entry is not remembered.
fn labels_name_each_key_once(entry: &[u8]) -> bool {
    let mut keys = Vec::new();
    sandbox_label_fields(entry, |mut field| {
        let named = key(&mut field)
            .and_then(|_| delimited(&mut field))
            .and_then(|e| map_entry(e, RECURSION_LIMIT - 1));
        // The full read has checked each of them.
        keys.push(named.ok().map(|(k, _)| k));
    });
    keys.sort_unstable();
    keys.windows(2).all(|w| w[0] != w[1])
}

/// Each label field (field 5, key and all) of a sandbox entry already read, as it
/// came: together they read as the entry's labels ([`sandbox_labels`]).
pub(crate) fn sandbox_label_fields<'a>(mut entry: &'a [u8], mut each: impl FnMut(&'a [u8])) {
    while !entry.is_empty() {
        let Ok((tag, len)) = field_len(entry, RECURSION_LIMIT) else {
            return;
        };
        let (field, rest) = entry.split_at(len);
        entry = rest;
        if tag == 5 {
            each(field);
        }
    }
}

/// Every container of a `ListContainersResponse`, in order — or why prost would
/// refuse it.
pub fn containers<'a>(buf: &'a [u8], each: impl FnMut(ContainerFields<'a>)) -> Res<()> {
    containers_memo(buf, None, each)
}

/// [`containers`], the entries a memo vouches for read lightly (as
/// [`sandboxes_memo`]).
pub(crate) fn containers_memo<'a>(
    buf: &'a [u8],
    mut memo: Option<&mut ListMemo>,
    mut each: impl FnMut(ContainerFields<'a>),
) -> Res<()> {
    entries(buf, |entry, _| {
        each(container_entry(
            entry,
            memo.as_deref_mut().map(|m| &mut m.containers),
        )?);
        Ok(())
    })
}

/// The entries of a list response (or of its rest, from a top-level field on: fields
/// are read in order, and entries only append), each as its bytes, in order — or why
/// prost would refuse it (an error of `each` ends the read).
pub(crate) fn list_entries<'a>(
    buf: &'a [u8],
    mut each: impl FnMut(&'a [u8]) -> Res<()>,
) -> Res<()> {
    entries(buf, |entry, _| each(entry))
}

/// One container entry of a list, read as [`containers_memo`] reads it (the
/// memo: its containers part).
pub(crate) fn container_entry<'a>(
    entry: &'a [u8],
    memo: Option<&mut EntryMemo>,
) -> Res<ContainerFields<'a>> {
    let depth = RECURSION_LIMIT - 1;
    let read = |fp: Option<&mut Fingerprint<'_>>| match fp {
        None => container_read(entry, depth),
        // A closure, as for a sandbox.
        Some(fp) => light_read(entry, depth, fp, &CONTAINER_LIGHT, |f, k, b, d| {
            container_field(f, k, b, d)
        }),
    };
    // plegd keeps none of a container's map fields.
    memoized(memo, &CONTAINER_LIGHT, read, || true).map(|(fields, _)| fields)
}

/// The labels of a sandbox entry returned by [`sandboxes`] (read again: only the
/// sandboxes of pods that changed need them).
pub fn sandbox_labels(entry: &[u8]) -> Res<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    sandbox_fields(entry, RECURSION_LIMIT - 1, Some(&mut labels))?;
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use prost::encoding::encode_key;
    use prost::Message;

    use super::*;
    use crate::wire_testing::{entry, mangle, unknown_field, Rng};
    use crate::{convert, cri, Container, NodeLists, RuntimeError, Sandbox};

    /// Each field of a message encoded on its own (a map entry, or a part of an
    /// embedded message, as a field of its own): shuffled, repeated and mixed with
    /// unknown fields, they are still one valid encoding of a message.
    fn sandbox_fields_encoded(rng: &mut Rng) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let one = |s: cri::PodSandbox| s.encode_to_vec();
        for _ in 0..rng.below(3) {
            out.push(one(cri::PodSandbox {
                id: rng.text(),
                ..Default::default()
            }));
        }
        for _ in 0..rng.below(3) {
            let meta = cri::PodSandboxMetadata {
                name: if rng.chance(70) {
                    rng.text()
                } else {
                    "".into()
                },
                uid: if rng.chance(80) {
                    format!("u{}", rng.below(4))
                } else {
                    rng.text()
                },
                namespace: rng.text(),
                attempt: rng.varint_value() as u32,
            };
            let mut bytes = Vec::new();
            cri::PodSandbox {
                metadata: Some(meta),
                ..Default::default()
            }
            .encode(&mut bytes)
            .expect("a Vec grows");
            out.push(bytes);
        }
        for _ in 0..rng.below(3) {
            out.push(one(cri::PodSandbox {
                state: rng.varint_value() as i32,
                created_at: rng.varint_value() as i64,
                runtime_handler: rng.text(),
                ..Default::default()
            }));
        }
        for (k, v) in rng.map() {
            out.push(one(cri::PodSandbox {
                labels: [(k, v)].into(),
                ..Default::default()
            }));
        }
        for (k, v) in rng.map() {
            out.push(one(cri::PodSandbox {
                annotations: [(k, v)].into(),
                ..Default::default()
            }));
        }
        out
    }

    fn container_fields_encoded(rng: &mut Rng) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let one = |c: cri::Container| c.encode_to_vec();
        for _ in 0..rng.below(3) {
            out.push(one(cri::Container {
                id: rng.text(),
                pod_sandbox_id: if rng.chance(80) {
                    "s1".into()
                } else {
                    rng.text()
                },
                ..Default::default()
            }));
        }
        for _ in 0..rng.below(3) {
            out.push(one(cri::Container {
                metadata: Some(cri::ContainerMetadata {
                    name: rng.text(),
                    attempt: rng.varint_value() as u32,
                }),
                ..Default::default()
            }));
        }
        for _ in 0..rng.below(3) {
            out.push(one(cri::Container {
                image: Some(rng.image_spec()),
                image_ref: rng.text(),
                image_id: rng.text(),
                ..Default::default()
            }));
        }
        for _ in 0..rng.below(3) {
            out.push(one(cri::Container {
                state: rng.varint_value() as i32,
                created_at: rng.varint_value() as i64,
                ..Default::default()
            }));
        }
        for (k, v) in rng.map() {
            out.push(one(cri::Container {
                labels: [(k, v)].into(),
                annotations: rng.map(),
                ..Default::default()
            }));
        }
        out
    }

    /// A list response: field 1 per entry, unknown fields between them.
    fn list(rng: &mut Rng, entries: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in entries {
            if rng.chance(10) {
                out.extend(unknown_field(rng, 2));
            }
            encode_key(1, WireType::LengthDelimited, &mut out);
            prost::encoding::encode_varint(e.len() as u64, &mut out);
            out.extend(e);
        }
        out
    }

    fn via_prost_sandboxes(bytes: &[u8]) -> Result<Vec<Sandbox>, String> {
        cri::ListPodSandboxResponse::decode(bytes)
            .map(|r| {
                r.items
                    .into_iter()
                    .filter_map(|s| convert::sandbox_from_listed(s).ok())
                    .collect()
            })
            .map_err(|e| e.to_string())
    }

    fn via_prost_containers(bytes: &[u8]) -> Result<Vec<Container>, String> {
        cri::ListContainersResponse::decode(bytes)
            .map(|r| {
                r.containers
                    .into_iter()
                    .filter_map(|c| convert::container_from_listed(c).ok())
                    .collect()
            })
            .map_err(|e| e.to_string())
    }

    fn via_view(
        sandboxes: &[u8],
        containers: &[u8],
    ) -> Result<(Vec<Sandbox>, Vec<Container>), RuntimeError> {
        via_view_of(sandboxes, containers, None)
    }

    fn via_view_memo(
        sandboxes: &[u8],
        containers: &[u8],
        memo: &mut ListMemo,
    ) -> Result<(Vec<Sandbox>, Vec<Container>), RuntimeError> {
        via_view_of(sandboxes, containers, Some(memo))
    }

    /// The lists' bytes through [`NodeLists::view`] (or `view_memo`), owned.
    fn via_view_of(
        sandboxes: &[u8],
        containers: &[u8],
        memo: Option<&mut ListMemo>,
    ) -> Result<(Vec<Sandbox>, Vec<Container>), RuntimeError> {
        let lists = NodeLists::Wire {
            sandboxes: prost::bytes::Bytes::copy_from_slice(sandboxes),
            containers: prost::bytes::Bytes::copy_from_slice(containers),
        };
        let view = match memo {
            Some(memo) => lists.view_memo(memo)?,
            None => lists.view()?,
        };
        let s = view
            .sandboxes()
            .iter()
            .map(|s| {
                s.to_sandbox().map(|(s, labeled)| {
                    assert!(labeled, "a response's bytes hold every entry's labels");
                    s
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let c = view.containers().iter().map(|c| c.to_container()).collect();
        Ok((s, c))
    }

    /// The reader against prost's decoding plus the list calls' conversion, on
    /// generated lists (fields in any order, repeated, split embedded messages, maps,
    /// unknown fields and groups) and on the same bytes broken: the same entries when
    /// prost decodes them, an `Invalid` error when it does not — never a panic.
    #[test]
    fn reads_what_prost_decodes_and_refuses_what_it_refuses() {
        let mut rng = Rng::seeded(0x2545_f491_4f6c_dd1d);
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..20_000 {
            let sandboxes: Vec<_> = (0..rng.below(4))
                .map(|_| {
                    let f = sandbox_fields_encoded(&mut rng);
                    entry(&mut rng, f)
                })
                .collect();
            let containers: Vec<_> = (0..rng.below(4))
                .map(|_| {
                    let f = container_fields_encoded(&mut rng);
                    entry(&mut rng, f)
                })
                .collect();
            let (mut s_bytes, mut c_bytes) =
                (list(&mut rng, &sandboxes), list(&mut rng, &containers));
            if rng.chance(50) {
                s_bytes = mangle(&mut rng, s_bytes);
            } else {
                c_bytes = mangle(&mut rng, c_bytes);
            }
            let want = via_prost_sandboxes(&s_bytes)
                .and_then(|s| via_prost_containers(&c_bytes).map(|c| (s, c)));
            match (want, via_view(&s_bytes, &c_bytes)) {
                (Ok(want), Ok(got)) => {
                    assert_eq!(got, want, "{s_bytes:?} {c_bytes:?}");
                    ok += 1;
                }
                (Err(_), Err(RuntimeError::Invalid { .. })) => refused += 1,
                (want, got) => panic!("prost: {want:?}, reader: {got:?}\n{s_bytes:?}\n{c_bytes:?}"),
            }
        }
        // Both sides are exercised.
        assert!(
            ok > 5_000 && refused > 2_000,
            "{ok} read, {refused} refused"
        );
    }

    /// The reader's varints are prost's: on every input of up to two bytes (with and
    /// without bytes after them) and on random longer ones, the same value and the
    /// same bytes left, or both refuse.
    #[test]
    fn varints_read_as_prost_reads_them() {
        let mut inputs: Vec<Vec<u8>> = vec![Vec::new()];
        for a in 0..=255u8 {
            inputs.push(vec![a]);
            for b in 0..=255u8 {
                inputs.push(vec![a, b]);
                inputs.push(vec![a, b, 0x55]);
            }
        }
        let mut rng = Rng::seeded(0x9e37_79b9);
        for _ in 0..20_000 {
            let n = 1 + rng.below(12) as usize;
            inputs.push((0..n).map(|_| rng.below(256) as u8).collect());
            // Long ones (a time in nanoseconds takes 9 bytes), with bytes after them
            // or not, and runs of continuation bits of every length.
            let bits = 1 + rng.below(64);
            let value = (rng.below(1 << 32) << 32 | rng.below(1 << 32)) >> (64 - bits);
            let mut long = Vec::new();
            prost::encoding::encode_varint(value, &mut long);
            long.extend((0..rng.below(10)).map(|_| rng.below(256) as u8));
            inputs.push(long);
            let n = 1 + rng.below(12) as usize;
            inputs.push(
                (0..n)
                    .map(|_| rng.below(256) as u8 | (0x80 * u8::from(rng.chance(90))))
                    .collect(),
            );
        }
        let mut read = 0;
        for input in &inputs {
            let (mut ours, mut theirs) = (&input[..], &input[..]);
            let got = varint(&mut ours).ok();
            let want = decode_varint(&mut theirs).ok();
            assert_eq!(got, want, "{input:?}");
            if want.is_some() {
                assert_eq!(ours, theirs, "{input:?}");
                read += 1;
            }
        }
        assert!(read > 100_000, "{read} read");
    }

    /// A field's length without a call is the one its key and a skip measure, and
    /// what they refuse, it refuses: on every field the generators make, broken or
    /// cut off, with varints of every length, at every recursion budget that counts.
    #[test]
    fn a_fields_length_is_what_key_and_skip_measure() {
        let mut rng = Rng::seeded(0x2545_f491_4f6c_dd1d);
        let (mut fast, mut measured) = (0, 0);
        for _ in 0..20_000 {
            let mut fields = match rng.below(4) {
                0 => sandbox_fields_encoded(&mut rng),
                1 => container_fields_encoded(&mut rng),
                2 => vec![unknown_field(&mut rng, 3)],
                // Lengths of two bytes and more (a large annotation).
                _ => {
                    let mut field = Vec::new();
                    let len = rng.below(20_000) as usize;
                    encode_key(
                        1 + rng.below(20) as u32,
                        WireType::LengthDelimited,
                        &mut field,
                    );
                    prost::encoding::encode_varint(len as u64, &mut field);
                    field.resize(field.len() + len, b'a');
                    vec![field]
                }
            };
            let bits = 1 + rng.below(64);
            let value = (rng.below(1 << 32) << 32 | rng.below(1 << 32)) >> (64 - bits);
            fields.push(varint_field(1 + rng.below(20) as u32, value));
            let mut bytes = fields.swap_remove(rng.below(fields.len() as u64) as usize);
            // More after it: a few random bytes, or fields as long as itself.
            match rng.chance(50) {
                true => bytes.extend((0..rng.below(12)).map(|_| rng.below(256) as u8)),
                false => bytes.extend(bytes.repeat(2)),
            }
            let bytes = match rng.chance(30) {
                true => mangle(&mut rng, bytes),
                false => bytes,
            };
            for depth in [0, 1, 2, RECURSION_LIMIT - 1] {
                let got = field_len(&bytes, depth);
                assert_eq!(got, field_len_slow(&bytes, depth), "{bytes:?} at {depth}");
                measured += usize::from(got.is_ok());
            }
            fast += usize::from(field_len(&bytes, 1).is_ok() && bytes[0] < 0x80);
        }
        assert!(
            fast > 10_000 && measured > 40_000,
            "{fast} fast, {measured} measured"
        );
    }

    /// Groups nested past prost's recursion limit are refused, as prost refuses them,
    /// whether empty or holding a length-delimited field; just under it they are
    /// skipped.
    #[test]
    fn the_recursion_limit_is_prosts() {
        // Per content of the innermost group, per place: depths read, depths refused.
        let mut seen = [[(0, 0); 3]; 2];
        for (depth, content) in [90, 97, 98, 99, 100, 101, 150]
            .into_iter()
            .flat_map(|d| [(d, 0), (d, 1)])
        {
            let mut group = Vec::new();
            for _ in 0..depth {
                encode_key(12, WireType::StartGroup, &mut group);
            }
            // Empty, or a length-delimited field (skipped without a call).
            if content == 1 {
                encode_key(13, WireType::LengthDelimited, &mut group);
                group.extend([1, b'x']);
            }
            for _ in 0..depth {
                encode_key(12, WireType::EndGroup, &mut group);
            }
            let entry = cri::PodSandbox {
                id: "s1".into(),
                metadata: Some(cri::PodSandboxMetadata {
                    uid: "u1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }
            .encode_to_vec();
            // In the entry, in its metadata, and at the top of the response.
            let mut in_meta = Vec::new();
            encode_key(2, WireType::LengthDelimited, &mut in_meta);
            prost::encoding::encode_varint(group.len() as u64, &mut in_meta);
            in_meta.extend(&group);
            for (place, (top, inner)) in [
                (vec![], group.clone()),
                (vec![], in_meta),
                (group.clone(), vec![]),
            ]
            .into_iter()
            .enumerate()
            {
                let mut e = entry.clone();
                e.extend(&inner);
                let mut bytes = top.clone();
                bytes.extend(list(&mut Rng::seeded(1), &[e]));
                let want = via_prost_sandboxes(&bytes);
                let got = via_view(&bytes, &[]);
                assert_eq!(want.is_ok(), got.is_ok(), "depth {depth}: {want:?} {got:?}");
                if got.is_ok() {
                    seen[content][place].0 += 1;
                } else {
                    seen[content][place].1 += 1;
                }
            }
        }
        // The limit falls inside the depths tried, wherever the groups are.
        assert!(
            seen.iter()
                .flatten()
                .all(|&(read, refused)| read > 0 && refused > 0),
            "{seen:?}"
        );
    }

    /// A realistic response (kubelet's labels and annotations on every entry) reads
    /// the same as prost, and an empty one is an empty list.
    #[test]
    fn a_kubelet_like_list_reads_like_prost() {
        let labels: HashMap<String, String> = [
            ("io.kubernetes.pod.name", "web-0"),
            ("io.kubernetes.pod.namespace", "default"),
            (
                "io.kubernetes.pod.uid",
                "8d4c0e5a-0000-4000-8000-000000000001",
            ),
            ("io.kubernetes.container.name", "app"),
            ("app", "web"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let resp = cri::ListContainersResponse {
            containers: (0..50)
                .map(|i| cri::Container {
                    id: format!("{i:064x}"),
                    pod_sandbox_id: format!("{:064x}", i / 2),
                    metadata: Some(cri::ContainerMetadata {
                        name: format!("app-{i}"),
                        attempt: i,
                    }),
                    image: Some(cri::ImageSpec {
                        image: "registry.k8s.io/pause:3.9".into(),
                        ..Default::default()
                    }),
                    image_ref: "sha256:abc".into(),
                    state: (i % 4) as i32,
                    created_at: 1_700_000_000_000_000_000 + i64::from(i),
                    labels: labels.clone(),
                    annotations: labels.clone(),
                    image_id: "sha256:def".into(),
                })
                .collect(),
        };
        let bytes = resp.encode_to_vec();
        let (s, c) = via_view(&[], &bytes).expect("a valid response");
        assert!(s.is_empty());
        assert_eq!(c.len(), 50);
        assert_eq!(Ok(c), via_prost_containers(&bytes));
    }

    /// A varint field, encoded even when it is 0 (prost leaves a 0 out).
    fn varint_field(tag: u32, value: u64) -> Vec<u8> {
        let mut out = Vec::new();
        encode_key(tag, WireType::Varint, &mut out);
        prost::encoding::encode_varint(value, &mut out);
        out
    }

    /// A containers list with the map fields left out of each entry the memo
    /// remembers by its other fields; the list as is where it does not split into
    /// entries.
    fn maps_left_out_where_remembered(memo: &ListMemo, list: &[u8]) -> Vec<u8> {
        let mut entries = Vec::new();
        let split = list_entries(list, |e| {
            entries.push(e);
            Ok(())
        });
        if split.is_err() {
            return list.to_vec();
        }
        let mut out = Vec::new();
        for entry in entries {
            let mut fields = Vec::new();
            let mut rest = entry;
            while let Ok((_, len)) = field_len(rest, RECURSION_LIMIT - 1) {
                fields.push(&rest[..len]);
                rest = &rest[len..];
                if rest.is_empty() {
                    break;
                }
            }
            let key = match rest.is_empty() {
                true => fingerprint(&memo.containers, &CONTAINER, entry),
                false => None,
            };
            let kept = match key {
                Some(k) if memo.containers.holds(k) => fields
                    .into_iter()
                    .filter(|f| !CONTAINER.maps.contains(&tag_of(f)))
                    .collect::<Vec<_>>()
                    .concat(),
                _ => entry.to_vec(),
            };
            encode_key(1, WireType::LengthDelimited, &mut out);
            prost::encoding::encode_varint(kept.len() as u64, &mut out);
            out.extend(kept);
        }
        out
    }

    /// An entry's top-level fields' bytes.
    fn fields_of(mut entry: &[u8]) -> Vec<&[u8]> {
        let mut out = Vec::new();
        while !entry.is_empty() {
            let field = entry;
            let (tag, wt) = key(&mut entry).expect("a key");
            skip(wt, tag, &mut entry, RECURSION_LIMIT).expect("a whole field");
            out.push(&field[..field.len() - entry.len()]);
        }
        out
    }

    /// An entry's kind: the fields plegd reads, its map fields (by tag), and whether
    /// those are parts of its fingerprint.
    struct Kind {
        reads: &'static [u32],
        maps: &'static [u32],
        hash_maps: bool,
    }
    const SANDBOX: Kind = Kind {
        reads: &[1, 2, 3, 4],
        maps: &[5, 6],
        hash_maps: true,
    };
    const CONTAINER: Kind = Kind {
        reads: &[1, 2, 3, 6, 7],
        maps: &[8, 9],
        hash_maps: false,
    };

    /// The parts of an entry its fingerprint sums: each map field (if its kind's
    /// count), and each run of the other fields between them.
    fn parts_of<'e>(entry: &'e [u8], kind: &Kind) -> Vec<&'e [u8]> {
        let (mut parts, mut run) = (Vec::new(), 0);
        let mut at = 0;
        for field in fields_of(entry) {
            if kind.maps.contains(&tag_of(field)) {
                if run < at {
                    parts.push(&entry[run..at]);
                }
                if kind.hash_maps {
                    parts.push(field);
                }
                run = at + field.len();
            }
            at += field.len();
        }
        if run < at {
            parts.push(&entry[run..]);
        }
        parts
    }

    /// The entry with its map fields in reverse order (the other fields in place).
    fn maps_reversed(entry: &[u8], kind: &Kind) -> Vec<u8> {
        let fields = fields_of(entry);
        let mut maps = fields
            .iter()
            .filter(|f| kind.maps.contains(&tag_of(f)))
            .rev();
        fields
            .iter()
            .map(|f| match kind.maps.contains(&tag_of(f)) {
                true => maps.next().expect("as many"),
                false => f,
            })
            .flat_map(|f| f.iter().copied())
            .collect()
    }

    fn tag_of(field: &[u8]) -> u32 {
        key(&mut &field[..]).expect("a key").0
    }

    /// Whether an entry names a field plegd reads twice (the memo never keeps it).
    fn repeats_a_read(entry: &[u8], kind: &Kind) -> bool {
        let tags: Vec<u32> = fields_of(entry).into_iter().map(tag_of).collect();
        kind.reads
            .iter()
            .any(|r| tags.iter().filter(|&t| t == r).count() > 1)
    }

    /// The fingerprint a memo keeps of an entry: of all its parts; None for one that
    /// names a field plegd reads twice.
    fn fingerprint(memo: &EntryMemo, kind: &Kind, entry: &[u8]) -> Option<crate::list_memo::Key> {
        let mut fp = memo.fingerprint();
        for part in parts_of(entry, kind) {
            fp.field(part);
        }
        for field in fields_of(entry) {
            let tag = tag_of(field);
            if kind.reads.contains(&tag) {
                fp.note_read(tag);
            }
            if tag == 1 {
                fp.id(field);
            }
        }
        assert_eq!(fp.key().is_none(), repeats_a_read(entry, kind));
        fp.key()
    }

    fn remembers(memo: &ListMemo, entry: &[u8], container: bool) -> bool {
        let (part, kind) = if container {
            (&memo.containers, &CONTAINER)
        } else {
            (&memo.sandboxes, &SANDBOX)
        };
        fingerprint(part, kind, entry).is_some_and(|key| part.holds(key))
    }

    /// How many fingerprints entries have: multisets of their parts, those that name
    /// a field plegd reads twice left out.
    fn distinct(entries: &[Vec<u8>], kind: &Kind) -> usize {
        entries
            .iter()
            .filter(|e| !repeats_a_read(e, kind))
            .map(|e| {
                let mut parts = parts_of(e, kind);
                parts.sort();
                parts
            })
            .collect::<std::collections::HashSet<_>>()
            .len()
    }

    /// A list of 0–5 generated entries (`fields` makes each one's), broken now and
    /// then.
    fn generated_list(rng: &mut Rng, fields: fn(&mut Rng) -> Vec<Vec<u8>>) -> Vec<u8> {
        let entries: Vec<_> = (0..rng.below(6))
            .map(|_| {
                let f = fields(rng);
                entry(rng, f)
            })
            .collect();
        let bytes = list(rng, &entries);
        if rng.chance(40) {
            mangle(rng, bytes)
        } else {
            bytes
        }
    }

    /// Where frames cut `len` bytes: at every offset, nowhere, or at a few random ones.
    fn frame_cuts(rng: &mut Rng, len: usize) -> Vec<usize> {
        let mut cuts: Vec<usize> = match rng.below(3) {
            0 => (1..len).collect(),
            1 => Vec::new(),
            _ => (0..rng.below(8))
                .map(|_| rng.below(len as u64 + 1) as usize)
                .collect(),
        };
        cuts.sort_unstable();
        cuts
    }

    /// 3,000 generated lists (`fields` makes each entry's), broken now and then, read
    /// whole (`whole`) and in pieces (`pieces`, as frames cut them) twice, with a
    /// fresh memo and with the memo of that read: each read in pieces gives what the
    /// whole read gives (`same`, told the round), or its error; the second vouches for
    /// every entry.
    fn read_in_pieces<W: std::fmt::Debug, G: std::fmt::Debug>(
        seed: u64,
        fields: fn(&mut Rng) -> Vec<Vec<u8>>,
        whole: impl Fn(&[u8]) -> Res<Vec<W>>,
        pieces: impl Fn(&[u8], &[usize], &mut ListMemo) -> Res<G>,
        same: impl Fn(usize, &G, &[W]),
    ) {
        let mut rng = Rng::seeded(seed);
        let (mut ok, mut refused, mut vouched) = (0, 0, 0);
        for _ in 0..3_000 {
            let bytes = generated_list(&mut rng, fields);
            let want = whole(&bytes);
            let mut memo = ListMemo::default();
            for round in 0..2 {
                let cuts = frame_cuts(&mut rng, bytes.len());
                let before = memo.len();
                let got = pieces(&bytes, &cuts, &mut memo);
                match (&want, &got) {
                    (Ok(want), Ok(got)) => {
                        same(round, got, want);
                        ok += 1;
                        if round == 1 && !want.is_empty() {
                            assert_eq!(memo.len(), before, "nothing new: every entry vouched for");
                            vouched += 1;
                        }
                    }
                    (Err(want), Err(got)) => {
                        assert_eq!(got, want, "{bytes:?} cut at {cuts:?}");
                        refused += 1;
                    }
                    (want, got) => {
                        panic!("whole: {want:?}\nin pieces: {got:?}\n{bytes:?} cut at {cuts:?}")
                    }
                }
                memo.finish(got.is_ok());
            }
        }
        assert!(
            ok > 2_000 && refused > 500 && vouched > 500,
            "{ok} read, {refused} refused, {vouched} vouched"
        );
    }

    /// A `ListContainersResponse` given in pieces, as HTTP/2 frames give it (cut
    /// anywhere: inside a key, a length, an entry; many cuts or none), reads as the
    /// whole bytes read — the same entries, or the same error — with a fresh memo and
    /// with one that vouches for the entries of the read before.
    #[test]
    fn a_list_read_in_pieces_reads_as_the_whole_bytes() {
        read_in_pieces(
            0x5851_f42d_4c95_7f2d,
            container_fields_encoded,
            // Entries compared by their `Debug` form: every field, owned.
            |bytes| {
                let mut whole = Vec::new();
                containers_memo(bytes, None, |f| whole.push(format!("{f:?}"))).map(|()| whole)
            },
            crate::list_sink::sunk_in_pieces::<crate::ContainerList>,
            |_, got, want| {
                let got: Vec<_> = got.iter().map(|f| format!("{f:?}")).collect();
                assert_eq!(got, want);
            },
        );
    }

    /// The same for a `ListPodSandboxResponse`: the same entries, each with its
    /// labels when its entry was checked in full (all of them with a fresh memo, none
    /// the memo vouched for: every entry of the read before but those that name a
    /// field plegd reads twice), or the same error.
    #[test]
    fn a_sandbox_list_read_in_pieces_reads_as_the_whole_bytes() {
        read_in_pieces(
            0x2545_f491_4f6c_dd1d,
            sandbox_fields_encoded,
            |bytes| {
                let mut whole = Vec::new();
                sandboxes_memo(bytes, None, |f, entry| {
                    let labels = sandbox_labels(entry).expect("a valid entry's labels");
                    let repeats = repeats_a_read(entry, &SANDBOX);
                    whole.push((format!("{f:?}"), labels, repeats))
                })
                .map(|()| whole)
            },
            crate::list_sink::sunk_in_pieces::<crate::SandboxList>,
            |round, got, want| {
                let got: Vec<_> = got
                    .iter()
                    .map(|(f, labels)| (format!("{f:?}"), labels.map(sandbox_labels)))
                    .collect();
                assert_eq!(got.len(), want.len());
                for (i, ((f, labels), (want_f, want_labels, repeats))) in
                    got.iter().zip(want).enumerate()
                {
                    assert_eq!(f, want_f);
                    match (round, labels) {
                        (_, Some(Ok(labels))) if round == 0 || *repeats => {
                            assert_eq!(labels, want_labels)
                        }
                        // An entry whose fields are an earlier one's of the same read:
                        // vouched for.
                        (0, None) => assert!(got[..i]
                            .iter()
                            .any(|(_, l)| l.as_ref() == Some(&Ok(want_labels.clone())))),
                        (1, None) if !repeats => {}
                        other => panic!("round {round}: labels {other:?}"),
                    }
                }
            },
        );
    }

    /// Reads with one memo over rounds of a changing node — the same bytes, entries
    /// changed (another state appended: the last one wins), reordered, their fields
    /// reordered (containerd sends maps in Go's random order), added and removed, and
    /// now and then broken — give what reads without it give (a broken round: of the
    /// bytes with the map fields of each container the memo remembers by its other
    /// fields left out), and what prost decodes; after each good read the
    /// memo holds exactly that read's entries (an entry being its parts, in any
    /// order), after a failed one what it held.
    #[test]
    fn a_memo_reads_what_a_read_without_it_reads() {
        let mut rng = Rng::seeded(0x9e37_79b9_7f4a_7c15);
        let (mut light, mut failed) = (0, 0);
        for _ in 0..400 {
            let mut memo = ListMemo::default();
            let mut sandboxes: Vec<Vec<u8>> = (0..rng.below(6))
                .map(|_| {
                    let f = sandbox_fields_encoded(&mut rng);
                    entry(&mut rng, f)
                })
                .collect();
            let mut containers: Vec<Vec<u8>> = (0..rng.below(6))
                .map(|_| {
                    let f = container_fields_encoded(&mut rng);
                    entry(&mut rng, f)
                })
                .collect();
            for _ in 0..8 {
                match rng.below(7) {
                    0 => {}
                    1 => {
                        for (list, tag) in [(&mut sandboxes, 3), (&mut containers, 6)] {
                            if !list.is_empty() {
                                let at = rng.below(list.len() as u64) as usize;
                                list[at].extend(varint_field(tag, rng.varint_value()));
                            }
                        }
                    }
                    2 => {
                        for list in [&mut sandboxes, &mut containers] {
                            for i in (1..list.len()).rev() {
                                list.swap(i, rng.below(i as u64 + 1) as usize);
                            }
                        }
                    }
                    6 => {
                        // Each entry's map fields in another order (as containerd
                        // sends them), now and then all its fields.
                        for (list, kind) in
                            [(&mut sandboxes, &SANDBOX), (&mut containers, &CONTAINER)]
                        {
                            for e in list.iter_mut() {
                                if rng.chance(75) {
                                    *e = maps_reversed(e, kind);
                                    continue;
                                }
                                let mut fields = fields_of(e);
                                for i in (1..fields.len()).rev() {
                                    fields.swap(i, rng.below(i as u64 + 1) as usize);
                                }
                                *e = fields.concat();
                            }
                        }
                    }
                    3 => {
                        let f = sandbox_fields_encoded(&mut rng);
                        sandboxes.push(entry(&mut rng, f));
                        let f = container_fields_encoded(&mut rng);
                        containers.insert(0, entry(&mut rng, f));
                    }
                    4 => {
                        for list in [&mut sandboxes, &mut containers] {
                            if !list.is_empty() {
                                list.remove(rng.below(list.len() as u64) as usize);
                            }
                        }
                    }
                    5 => {
                        // Broken bytes, read in place of this round's lists: as the
                        // bytes are read without the memo, but for a container it
                        // remembers by its other fields, whose map fields go unread.
                        let before = memo.len();
                        let s = list(&mut rng, &sandboxes);
                        let c = list(&mut rng, &containers);
                        let c = mangle(&mut rng, c);
                        let want = via_view(&s, &maps_left_out_where_remembered(&memo, &c));
                        let got = via_view_memo(&s, &c, &mut memo);
                        match (want, got) {
                            (Ok(want), Ok(got)) => assert_eq!(got, want),
                            (Err(_), Err(RuntimeError::Invalid { .. })) => {
                                assert_eq!(memo.len(), before, "a failed read changed the memo");
                                failed += 1;
                            }
                            (want, got) => panic!("without: {want:?}, with: {got:?}\n{c:?}"),
                        }
                    }
                    _ => {}
                }
                let (s, c) = (list(&mut rng, &sandboxes), list(&mut rng, &containers));
                let remembered = sandboxes
                    .iter()
                    .filter(|e| remembers(&memo, e, false))
                    .count()
                    + containers
                        .iter()
                        .filter(|e| remembers(&memo, e, true))
                        .count();
                light += remembered;
                let want = via_view(&s, &c).expect("valid lists");
                assert_eq!(want.0, via_prost_sandboxes(&s).expect("prost decodes"));
                assert_eq!(want.1, via_prost_containers(&c).expect("prost decodes"));
                let got = via_view_memo(&s, &c, &mut memo).expect("valid lists");
                assert_eq!(got, want, "{s:?} {c:?}");
                assert_eq!(
                    memo.len(),
                    (
                        distinct(&sandboxes, &SANDBOX),
                        distinct(&containers, &CONTAINER)
                    )
                );
            }
        }
        // Many entries were read lightly (the generated entries often change a field
        // plegd reads, or name one twice); broken rounds were refused.
        assert!(
            light > 4_000 && failed > 50,
            "{light} light, {failed} failed"
        );
    }

    /// `cri::Container` bytes: an ID, a sandbox, a state and an annotation (its value's
    /// bytes as given), each field encoded on its own.
    fn container_entry(id: &str, state: u64, annotation: &[u8]) -> Vec<u8> {
        let mut out = cri::Container {
            id: id.into(),
            pod_sandbox_id: "s1".into(),
            metadata: Some(cri::ContainerMetadata {
                name: "app".into(),
                attempt: 1,
            }),
            ..Default::default()
        }
        .encode_to_vec();
        out.extend(varint_field(6, state));
        // Field 9 (annotations), one entry: key "k", value `annotation`.
        let mut kv = vec![0x0a, 1, b'k', 0x12, annotation.len() as u8];
        kv.extend(annotation);
        encode_key(9, WireType::LengthDelimited, &mut out);
        prost::encoding::encode_varint(kv.len() as u64, &mut out);
        out.extend(kv);
        out
    }

    fn containers_list(entries: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in entries {
            encode_key(1, WireType::LengthDelimited, &mut out);
            prost::encoding::encode_varint(e.len() as u64, &mut out);
            out.extend(*e);
        }
        out
    }

    /// Pod `i`'s sandbox `id` (named p`i`, UID u`i`), labelled `app`.
    fn pod_sandbox(id: &str, i: usize, app: String) -> cri::PodSandbox {
        cri::PodSandbox {
            id: id.into(),
            metadata: Some(cri::PodSandboxMetadata {
                name: format!("p{i}"),
                uid: format!("u{i}"),
                namespace: "ns".into(),
                attempt: 0,
            }),
            labels: [("app".to_string(), app)].into(),
            ..Default::default()
        }
    }

    /// The global relist keeps its read's packed lists for the next read: a read in
    /// them reads what a fresh read reads, whether the node grew, shrank or changed
    /// (a sandbox's labels kept only when the memo did not vouch for its entry); they
    /// keep their room while the node keeps its size, and are given back when the
    /// node shrinks to a fraction.
    #[test]
    fn a_read_in_the_last_reads_buffers_reads_what_a_fresh_read_reads() {
        let mut memo = ListMemo::default();
        let mut kept_room = 0;
        let mut last_n = 0;
        for (round, n) in [600, 100, 900, 900, 900, 5].into_iter().enumerate() {
            let entries: Vec<_> = (0..n)
                .map(|i| container_entry(&format!("c{round}-{i}"), (i % 3) as u64, b"v"))
                .collect();
            let refs: Vec<&[u8]> = entries.iter().map(|e| e.as_slice()).collect();
            let containers = containers_list(&refs);
            let sandboxes = cri::ListPodSandboxResponse {
                items: (0..n)
                    // The same sandboxes from round to round (pod i's).
                    .map(|i| pod_sandbox(&format!("s{i}"), i, format!("p{i}")))
                    .collect(),
            }
            .encode_to_vec();
            let mut fresh = via_view(&sandboxes, &containers).expect("valid");
            let lists = NodeLists::sunk(&sandboxes, &containers, 7, &mut memo).expect("valid");
            let view = lists.view_memo(&mut memo).expect("valid");
            let got: (Vec<_>, Vec<_>) = (
                view.sandboxes()
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let (sandbox, labeled) = s.to_sandbox().expect("labels");
                        // Pod i's labels were checked in the last read if it had i.
                        assert_eq!(labeled, i >= last_n, "round {round}: sandbox {i}");
                        if !labeled {
                            fresh.0[i].labels.clear();
                        }
                        sandbox
                    })
                    .collect(),
                view.containers().iter().map(|c| c.to_container()).collect(),
            );
            assert_eq!(got, fresh, "round {round}");
            assert_eq!(got.1.len(), n);
            last_n = n;
            drop(view);
            memo.keep(lists);
            match round {
                3 => kept_room = memo.heap_bytes(),
                4 => assert_eq!(memo.heap_bytes(), kept_room, "the same node: the same room"),
                5 => assert!(
                    memo.heap_bytes() < kept_room / 8,
                    "{} bytes kept for 5 pods",
                    memo.heap_bytes()
                ),
                _ => {}
            }
        }
        // The memo's tables alone hold ≈ 20 bytes an entry, the packed lists 80 more.
        assert!(kept_room > 900 * 90, "{kept_room}: the lists are kept");
    }

    /// After the first read (every sandbox's labels kept) the next keeps almost none:
    /// the labels' room is let go, the rest of the sandboxes' list is kept.
    #[test]
    fn the_sandboxes_room_outlives_the_first_reads_labels() {
        let sandboxes = cri::ListPodSandboxResponse {
            items: (0..2000)
                .map(|i| pod_sandbox(&format!("{i:064x}"), i, "a".repeat(100)))
                .collect(),
        }
        .encode_to_vec();
        let mut memo = ListMemo::default();
        let mut room = Vec::new();
        for _ in 0..3 {
            let lists = NodeLists::sunk(&sandboxes, &[], 100, &mut memo).expect("valid");
            lists.view_memo(&mut memo).expect("valid");
            memo.keep(lists);
            room.push(memo.heap_bytes());
        }
        // 2,000 IDs of 64 bytes and their entries, kept; 2,000 labels of 100 bytes, not.
        assert!(room[1] > 2000 * 100, "{room:?}");
        assert!(room[0] > room[1] + 2000 * 100, "{room:?}");
        assert_eq!(room[1], room[2], "{room:?}");
    }

    /// An entry remembered under its ID whose bytes change into ones prost refuses
    /// (its state changed and an annotation's value not UTF-8; its image spec of the
    /// wrong wire type) fails the read; the memo is left as it was (neither the
    /// refused entry nor a new one checked before it is remembered), and the next good
    /// read still finds the remembered entries. A container whose map fields alone
    /// changed so is read (they are checked when its other fields are first met);
    /// met twice in one read, the second is checked again.
    #[test]
    fn a_changed_entry_prost_refuses_fails_the_read_though_its_id_is_remembered() {
        let good = container_entry("c1", 1, b"v");
        let other = container_entry("c2", 1, b"w");
        let new = container_entry("c3", 1, b"x");
        // Its state changed, its annotation not UTF-8.
        let not_utf8 = container_entry("c1", 2, &[0xc3]);
        // Its image spec (field 4) a varint.
        let mut wrong_wire_type = good.clone();
        wrong_wire_type.extend(varint_field(4, 1));
        let mut memo = ListMemo::default();
        let both = containers_list(&[&good, &other]);
        let (_, c) = via_view_memo(&[], &both, &mut memo).expect("valid");
        assert_eq!(c.len(), 2);
        for bad in [&not_utf8, &wrong_wire_type] {
            assert!(cri::ListContainersResponse::decode(&*containers_list(&[bad])).is_err());
            // A new entry checked before the refused one is not remembered either.
            let got = via_view_memo(&[], &containers_list(&[&other, &new, bad]), &mut memo);
            assert!(
                matches!(
                    got,
                    Err(RuntimeError::Invalid {
                        op: "ListContainers",
                        ..
                    })
                ),
                "{got:?}"
            );
            assert_eq!(memo.len(), (0, 2));
            assert!(remembers(&memo, &good, true) && remembers(&memo, &other, true));
            assert!(!remembers(&memo, bad, true) && !remembers(&memo, &new, true));
        }
        // A failed sandbox list leaves the containers' memo alone too.
        let got = via_view_memo(&[0x0a, 0x05], &both, &mut memo);
        assert!(matches!(
            got,
            Err(RuntimeError::Invalid {
                op: "ListPodSandbox",
                ..
            })
        ));
        assert_eq!(memo.len(), (0, 2));
        // The next good read: `other` still remembered, `good` gone from the node.
        let (_, c) = via_view_memo(&[], &containers_list(&[&other]), &mut memo).expect("valid");
        assert_eq!(c.len(), 1);
        assert_eq!(memo.len(), (0, 1));
        assert!(!remembers(&memo, &good, true));

        // A container's map fields are checked when its other fields are first met,
        // not again: the same container listed with its annotation changed in place
        // (CRI never does) to bytes prost refuses, or its labels field of the wrong
        // wire type, is read for what plegd reads; with a fresh memo it is refused.
        let changed_in_place = container_entry("c2", 1, &[0xc3]);
        let mut labels_wire_type = other.clone();
        labels_wire_type.extend(varint_field(8, 1));
        for bad in [&changed_in_place, &labels_wire_type] {
            let list = containers_list(&[bad]);
            assert!(cri::ListContainersResponse::decode(&*list).is_err());
            let (_, c) = via_view_memo(&[], &list, &mut memo).expect("vouched for");
            assert_eq!(
                c,
                via_view(&[], &containers_list(&[&other])).expect("valid").1
            );
            let got = via_view_memo(&[], &list, &mut ListMemo::default());
            assert!(matches!(got, Err(RuntimeError::Invalid { .. })), "{got:?}");
            // After the entry it repeats, in one read: checked, and refused, with a
            // fresh memo as with one that does not remember it.
            let twice = containers_list(&[&other, bad]);
            for mut memo in [ListMemo::default(), memo_of(&new)] {
                let got = via_view_memo(&[], &twice, &mut memo);
                assert!(matches!(got, Err(RuntimeError::Invalid { .. })), "{got:?}");
            }
        }
    }

    /// A memo that remembers the container `entry` alone.
    fn memo_of(entry: &[u8]) -> ListMemo {
        let mut memo = ListMemo::default();
        via_view_memo(&[], &containers_list(&[entry]), &mut memo).expect("valid");
        memo
    }

    /// The memo never supplies a field: an entry remembered with one state, listed
    /// again with another (its other bytes the same), is a new entry to it, read with
    /// the new state, and so is another ID; and even bytes the memo vouches for by a
    /// collision (here: put there by hand) are read for what they say — only what
    /// plegd does not read goes unchecked, and a field plegd reads of the wrong type
    /// is refused as prost refuses it.
    #[test]
    fn the_memo_vouches_for_bytes_and_never_supplies_a_field() {
        let mut memo = ListMemo::default();
        let running = container_entry("c1", 1, b"v");
        via_view_memo(&[], &containers_list(&[&running]), &mut memo).expect("valid");
        let exited = container_entry("c1", 2, b"v");
        assert!(!remembers(&memo, &exited, true));
        let (_, c) = via_view_memo(&[], &containers_list(&[&exited]), &mut memo).expect("valid");
        assert_eq!(c[0].state, crate::ContainerState::Exited);
        assert!(remembers(&memo, &exited, true) && !remembers(&memo, &running, true));
        let (_, c) = via_view_memo(&[], &containers_list(&[&running]), &mut memo).expect("valid");
        assert_eq!(c[0].state, crate::ContainerState::Running);
        let other_id = container_entry("c2", 1, b"v");
        assert!(!remembers(&memo, &other_id, true));
        let (_, c) = via_view_memo(&[], &containers_list(&[&other_id]), &mut memo).expect("valid");
        assert_eq!(c[0].id, "c2");
        assert_eq!(memo.len(), (0, 1));

        // A collision: the memo vouches for bytes never checked.
        let collide = |memo: &mut ListMemo, entry: &[u8]| {
            // (None: an entry naming a field plegd reads twice, never vouched for.)
            if let Some(key) = fingerprint(&memo.containers, &CONTAINER, entry) {
                memo.containers.add(key);
            }
            memo.finish(true);
        };
        // Its image spec's image not UTF-8.
        let mut invalid_image = container_entry("c9", 2, b"v");
        invalid_image.extend([0x22, 3, 0x0a, 1, 0xff]);
        assert!(cri::ListContainersResponse::decode(&*containers_list(&[&invalid_image])).is_err());
        collide(&mut memo, &invalid_image);
        let (_, c) = via_view_memo(&[], &containers_list(&[&invalid_image]), &mut memo)
            .expect("what plegd does not read goes unchecked");
        assert_eq!(
            (c[0].id.as_str(), c[0].state),
            ("c9", crate::ContainerState::Exited)
        );
        let mut state_not_a_varint = container_entry("c9", 2, b"v");
        encode_key(6, WireType::LengthDelimited, &mut state_not_a_varint);
        state_not_a_varint.push(0);
        collide(&mut memo, &state_not_a_varint);
        let got = via_view_memo(&[], &containers_list(&[&state_not_a_varint]), &mut memo);
        assert!(matches!(got, Err(RuntimeError::Invalid { .. })), "{got:?}");
        let mut id_not_utf8 = container_entry("c9", 2, b"v");
        id_not_utf8.extend([0x0a, 1, 0xff]);
        collide(&mut memo, &id_not_utf8);
        let got = via_view_memo(&[], &containers_list(&[&id_not_utf8]), &mut memo);
        assert!(matches!(got, Err(RuntimeError::Invalid { .. })), "{got:?}");
    }

    /// A sandbox listed again with its map fields in another order (containerd
    /// marshals labels and annotations in Go's random map order on every list) is
    /// still the entry remembered, and read as without the memo; a changed label is
    /// not, nor the same fields in another order otherwise (read fully, as without the
    /// memo, then remembered too). A container's map fields do not count at all.
    #[test]
    fn an_entry_is_its_map_entries_in_any_order() {
        let sandbox = |app: &str| {
            let mut entry = pod_sandbox("s1", 1, app.into()).encode_to_vec();
            // A second label, b=w.
            entry.extend([0x2a, 6, 0x0a, 1, b'b', 0x12, 1, b'w']);
            entry
        };
        let two = sandbox("web");
        assert_eq!(fields_of(&two).len(), 4);
        let mut memo = ListMemo::default();
        via_view_memo(&containers_list(&[&two]), &[], &mut memo).expect("valid");
        let swapped = maps_reversed(&two, &SANDBOX);
        assert_ne!(swapped, two);
        assert!(remembers(&memo, &swapped, false));
        let mut reversed = fields_of(&two);
        reversed.reverse();
        let reversed = reversed.concat();
        assert!(!remembers(&memo, &reversed, false));
        for entry in [&swapped, &reversed] {
            let list = containers_list(&[entry]);
            assert_eq!(
                via_view_memo(&list, &[], &mut memo).expect("valid"),
                via_view(&list, &[]).expect("valid")
            );
            assert!(remembers(&memo, entry, false));
        }
        assert!(!remembers(&memo, &sandbox("db"), false));

        let mut memo = ListMemo::default();
        let running = container_entry("c1", 1, b"v");
        via_view_memo(&[], &containers_list(&[&running]), &mut memo).expect("valid");
        assert!(remembers(&memo, &container_entry("c1", 1, b"x"), true));
        assert!(!remembers(&memo, &container_entry("c1", 2, b"v"), true));
    }

    #[test]
    fn a_sandbox_naming_a_label_twice_is_read_in_full_every_time() {
        // Label `a` twice: the last field gives its value, so the same fields swapped
        // are other labels, with the same parts.
        let label = |v: &[u8]| {
            let mut kv = vec![0x0a, 1, b'a', 0x12, v.len() as u8];
            kv.extend(v);
            let mut field = vec![0x2a, kv.len() as u8];
            field.extend(kv);
            field
        };
        let list = |first: &[u8], second: &[u8]| {
            let mut entry = pod_sandbox("s0", 0, "web".into()).encode_to_vec();
            entry.extend(label(first));
            entry.extend(label(second));
            containers_list(&[&entry])
        };
        let containers = containers_list(&[&container_entry("c0", 1, b"v")]);
        let mut memo = ListMemo::default();
        let mut read = |s: &[u8]| {
            let (sandboxes, _) = via_view_memo(s, &containers, &mut memo).expect("valid lists");
            (memo.unchanged(), sandboxes[0].labels["a"].clone())
        };
        assert_eq!(read(&list(b"1", b"2")), (false, "2".to_string()));
        assert_eq!(read(&list(b"2", b"1")), (false, "1".to_string()));
        assert_eq!(read(&list(b"2", b"1")), (false, "1".to_string()));
        // Its control: a key named once is remembered.
        let mut entry = pod_sandbox("s0", 0, "web".into()).encode_to_vec();
        entry.extend(label(b"1"));
        let once = containers_list(&[&entry]);
        assert_eq!(read(&once), (false, "1".to_string()));
        assert_eq!(read(&once), (true, "1".to_string()));
        // The packed lists keep no labels of a sandbox the memo vouched for (they are
        // taken from an earlier read): the swapped labels are read.
        let mut memo = ListMemo::default();
        let mut packed = |s: &[u8]| {
            let lists = NodeLists::sunk(s, &containers, 7, &mut memo).expect("valid lists");
            let view = lists.view_memo(&mut memo).expect("valid lists");
            let (sandbox, labeled) = view.sandboxes()[0].to_sandbox().expect("labels");
            (labeled, sandbox.labels.get("a").cloned())
        };
        assert_eq!(packed(&list(b"1", b"2")), (true, Some("2".to_string())));
        assert_eq!(packed(&list(b"2", b"1")), (true, Some("1".to_string())));
        assert_eq!(packed(&once), (true, Some("1".to_string())));
        assert_eq!(packed(&once), (false, None));
    }

    /// The memo tells a read whose lists are the last good read's, entry for entry
    /// in every field (but a container's map fields, which do not count), in any order
    /// of entries and of a sandbox's map fields; any change, an entry more or less, one
    /// listed twice, one that names a field plegd reads twice, a failed read, a
    /// cleared memo: not.
    #[test]
    fn the_memo_tells_lists_that_did_not_change() {
        let sandboxes = |apps: &[&str]| {
            cri::ListPodSandboxResponse {
                items: apps
                    .iter()
                    .enumerate()
                    .map(|(i, app)| pod_sandbox(&format!("s{i}"), i, app.to_string()))
                    .collect(),
            }
            .encode_to_vec()
        };
        let entries: Vec<Vec<u8>> = (0..6)
            .map(|i| container_entry(&format!("c{i}"), 1, format!("v{i}").as_bytes()))
            .collect();
        let refs = |entries: &[Vec<u8>]| -> Vec<u8> {
            containers_list(&entries.iter().map(|e| e.as_slice()).collect::<Vec<_>>())
        };
        let mut memo = ListMemo::default();
        let mut read = |s: &[u8], c: &[u8]| {
            via_view_memo(s, c, &mut memo).expect("valid lists");
            memo.unchanged()
        };
        let apps = ["a", "b", "c"];
        assert!(!read(&sandboxes(&apps), &refs(&entries)), "the first read");
        assert!(read(&sandboxes(&apps), &refs(&entries)));
        // An annotation more on each container: the same entries (a container's map
        // fields do not count).
        let mut two = entries.clone();
        for (i, e) in two.iter_mut().enumerate() {
            let more = container_entry(&format!("c{i}"), 1, b"w");
            e.extend(&more[fields_of(&more)[..4].concat().len()..]);
        }
        assert!(read(&sandboxes(&apps), &refs(&two)));
        // Entries in another order, each one's map fields in another order.
        let mut shuffled: Vec<Vec<u8>> = two.iter().map(|e| maps_reversed(e, &CONTAINER)).collect();
        assert_ne!(shuffled, two);
        shuffled.rotate_left(2);
        assert!(read(&sandboxes(&apps), &refs(&shuffled)));
        // Sandboxes of two labels, then the same with each one's labels in another
        // order: the same lists; then one label again: not.
        let labelled: Vec<Vec<u8>> = apps
            .iter()
            .enumerate()
            .map(|(i, app)| {
                let mut e = pod_sandbox(&format!("s{i}"), i, app.to_string()).encode_to_vec();
                e.extend([0x2a, 6, 0x0a, 1, b'b', 0x12, 1, b'w']);
                e
            })
            .collect();
        let reordered: Vec<Vec<u8>> = labelled
            .iter()
            .map(|e| maps_reversed(e, &SANDBOX))
            .collect();
        assert_ne!(reordered, labelled);
        assert!(!read(&refs(&labelled), &refs(&shuffled)));
        assert!(read(&refs(&reordered), &refs(&shuffled)));
        assert!(!read(&sandboxes(&apps), &refs(&shuffled)));
        assert!(read(&sandboxes(&apps), &refs(&shuffled)));
        // Their other fields in another order: other fingerprints, then the same.
        let reversed: Vec<Vec<u8>> = two
            .iter()
            .map(|e| fields_of(e).into_iter().rev().collect::<Vec<_>>().concat())
            .collect();
        assert!(!read(&sandboxes(&apps), &refs(&reversed)));
        assert!(read(&sandboxes(&apps), &refs(&reversed)));
        assert!(!read(&sandboxes(&apps), &refs(&entries)));
        assert!(read(&sandboxes(&apps), &refs(&entries)));
        // A container's state changed, then the same lists again.
        let mut exited = entries.clone();
        exited[3] = container_entry("c3", 2, b"v3");
        assert!(!read(&sandboxes(&apps), &refs(&exited)));
        assert!(read(&sandboxes(&apps), &refs(&exited)));
        // A sandbox changed (its labels).
        assert!(!read(&sandboxes(&["a", "x", "c"]), &refs(&exited)));
        assert!(read(&sandboxes(&["a", "x", "c"]), &refs(&exited)));
        let apps = ["a", "x", "c"];
        // An entry less, then one more.
        assert!(!read(&sandboxes(&apps), &refs(&exited[1..])));
        assert!(!read(&sandboxes(&apps), &refs(&exited)));
        assert!(read(&sandboxes(&apps), &refs(&exited)));
        // One listed twice in another's place: as many entries, each remembered.
        let mut twice = exited.clone();
        twice[5] = twice[4].clone();
        assert!(!read(&sandboxes(&apps), &refs(&twice)));
        assert!(!read(&sandboxes(&apps), &refs(&exited)));
        assert!(read(&sandboxes(&apps), &refs(&exited)));
        // An entry that names its state twice: never remembered, whatever its order.
        let mut two_states = exited.clone();
        let state = fields_of(&container_entry("c0", 2, b"v0"))
            .into_iter()
            .find(|f| tag_of(f) == 6)
            .expect("a state field")
            .to_vec();
        two_states[0].extend(&state);
        for _ in 0..2 {
            assert!(!read(&sandboxes(&apps), &refs(&two_states)));
        }
        assert!(!read(&sandboxes(&apps), &refs(&exited)));
        assert!(read(&sandboxes(&apps), &refs(&exited)));
        // A failed read, then the last good read's lists again.
        assert!(via_view_memo(&sandboxes(&apps), &[0x0a, 0x05], &mut memo).is_err());
        assert!(!memo.unchanged());
        let mut read = |s: &[u8], c: &[u8]| {
            via_view_memo(s, c, &mut memo).expect("valid lists");
            memo.unchanged()
        };
        assert!(read(&sandboxes(&apps), &refs(&exited)));
        memo.clear();
        assert!(!memo.unchanged());
        // Empty lists right after a clear (or first): no good read to be the same as.
        let mut read = |s: &[u8], c: &[u8]| {
            via_view_memo(s, c, &mut memo).expect("valid lists");
            memo.unchanged()
        };
        assert!(!read(&[], &[]));
        assert!(read(&[], &[]));
        // Lists that name an entry twice are never unchanged; the same without the
        // second one are not the same lists.
        let (a, b) = (&exited[0], &exited[1]);
        for _ in 0..2 {
            assert!(!read(&[], &refs(&[a.clone(), a.clone(), b.clone()])));
        }
        assert!(!read(&[], &refs(&[a.clone(), b.clone()])));
        assert!(read(&[], &refs(&[a.clone(), b.clone()])));
    }

    /// Over many rounds of churn (pods coming and going, each a new entry) the memo
    /// holds the last read's entries and its room stays what the node's size needs;
    /// when the node shrinks, it gives room back.
    #[test]
    fn the_memo_holds_the_last_reads_entries_and_does_not_grow() {
        let mut memo = ListMemo::default();
        let entry = |i: usize| container_entry(&format!("c{i}"), 1, format!("v{i}").as_bytes());
        let mut live: Vec<usize> = (0..2_000).collect();
        let mut next = live.len();
        let mut room = 0;
        for round in 0..50 {
            // A tenth of the pods replaced.
            for _ in 0..200 {
                live.remove(0);
                live.push(next);
                next += 1;
            }
            let entries: Vec<_> = live.iter().map(|&i| entry(i)).collect();
            let refs: Vec<&[u8]> = entries.iter().map(|e| e.as_slice()).collect();
            via_view_memo(&[], &containers_list(&refs), &mut memo).expect("valid");
            assert_eq!(memo.len(), (0, 2_000));
            if round == 1 {
                room = memo.heap_bytes();
            } else if round > 1 {
                assert_eq!(memo.heap_bytes(), room, "round {round}");
            }
        }
        // 16–32 bytes an entry (a power of two of slots, 12 bytes each, at most three
        // quarters full with the read's new entries).
        assert!(room <= 2_000 * 33, "{room} bytes");
        let few: Vec<_> = (0..10).map(entry).collect();
        let refs: Vec<&[u8]> = few.iter().map(|e| e.as_slice()).collect();
        via_view_memo(&[], &containers_list(&refs), &mut memo).expect("valid");
        assert_eq!(memo.len(), (0, 10));
        assert!(memo.heap_bytes() < room / 4, "{} bytes", memo.heap_bytes());
    }
}
