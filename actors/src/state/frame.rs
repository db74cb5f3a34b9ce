//! The state file's framing: each record is `[length u32][crc32 u32][kind u8][body]`
//! (little-endian; the checksum covers kind and body). A record is written with one
//! `write(2)`, so a killed process leaves at most its last record cut short: reading
//! stops there and the cut is reported as a torn tail (the record was never
//! acknowledged, nothing it held was shown to anyone). A record whose bytes are all
//! there but whose checksum is wrong is corruption, not a crash.

/// The largest record read back (a snapshot of one pod, or one relist's changes, is
/// far below it): a length above it is corruption.
pub const MAX_RECORD: usize = 256 << 20;

const HEAD: usize = 9;

/// Appends one record to `out`.
pub fn put(out: &mut Vec<u8>, kind: u8, body: &[u8]) {
    let len = u32::try_from(body.len() + 1).unwrap_or(u32::MAX);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[kind]);
    crc.update(body);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.push(kind);
    out.extend_from_slice(body);
}

/// How a read of the records ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// At the end of the bytes, on a record boundary.
    Clean,
    /// The last record is cut short (a process killed while writing it); its bytes
    /// start at this offset.
    Torn(usize),
    /// A record is damaged at this offset (not a cut: its bytes are there).
    Corrupt(usize),
}

/// Reads records from `bytes` in order: `(kind, body)` for each, then how it ended.
pub fn read(bytes: &[u8]) -> (Vec<(u8, &[u8])>, End) {
    let mut records = Vec::new();
    let mut at = 0;
    loop {
        let rest = &bytes[at..];
        if rest.is_empty() {
            return (records, End::Clean);
        }
        if rest.len() < HEAD {
            return (records, End::Torn(at));
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len == 0 || len > MAX_RECORD {
            return (records, End::Corrupt(at));
        }
        let Some(payload) = rest.get(8..8 + len) else {
            return (records, End::Torn(at));
        };
        if crc32fast::hash(payload) != crc {
            return (records, End::Corrupt(at));
        }
        records.push((payload[0], &payload[1..]));
        at += 8 + len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Vec<u8> {
        let mut out = Vec::new();
        put(&mut out, 1, b"one");
        put(&mut out, 2, b"");
        put(&mut out, 3, &[7u8; 300]);
        out
    }

    #[test]
    fn records_read_back_in_order() {
        let bytes = three();
        let (records, end) = read(&bytes);
        assert_eq!(end, End::Clean);
        let kinds: Vec<u8> = records.iter().map(|r| r.0).collect();
        assert_eq!(kinds, [1, 2, 3]);
        assert_eq!(records[0].1, b"one");
        assert_eq!(records[2].1.len(), 300);
    }

    #[test]
    fn a_cut_anywhere_in_the_last_record_is_a_torn_tail_after_the_others() {
        let bytes = three();
        let last = bytes.len() - (8 + 301);
        for cut in last + 1..bytes.len() {
            let (records, end) = read(&bytes[..cut]);
            assert_eq!(records.len(), 2, "cut at {cut}");
            assert_eq!(end, End::Torn(last), "cut at {cut}");
        }
    }

    #[test]
    fn a_flipped_bit_is_corruption_where_it_is() {
        let bytes = three();
        for i in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x10;
            let (records, end) = read(&damaged);
            // A length grown past the end reads as a cut; anything else is caught by
            // the checksum or the length's bound. Never a wrong record.
            match end {
                End::Clean => panic!("a damaged byte {i} read as clean"),
                End::Torn(at) | End::Corrupt(at) => assert!(records.len() <= 2 && at <= i),
            }
            for (kind, body) in records {
                let (ok, _) = read(&bytes);
                assert!(ok.contains(&(kind, body)));
            }
        }
    }
}
