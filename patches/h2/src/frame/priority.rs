use crate::frame::*;

use bytes::BufMut;

#[derive(Debug, Eq, PartialEq)]
pub struct Priority {
    stream_id: StreamId,
    dependency: StreamDependency,
}

#[derive(Debug, Eq, PartialEq)]
pub struct StreamDependency {
    /// The ID of the stream dependency target
    dependency_id: StreamId,

    /// The weight for the stream. The value exposed (and set) here is always in
    /// the range [0, 255], instead of [1, 256] (as defined in section 5.3.2.)
    /// so that the value fits into a `u8`.
    weight: u8,

    /// True if the stream dependency is exclusive.
    is_exclusive: bool,
}

impl Priority {
    pub fn load(head: Head, payload: &[u8]) -> Result<Self, Error> {
        let dependency = StreamDependency::load(payload)?;

        if dependency.dependency_id() == head.stream_id() {
            return Err(Error::InvalidDependencyId);
        }

        Ok(Priority {
            stream_id: head.stream_id(),
            dependency,
        })
    }
}

impl Priority {
    /// Writes the frame: its head, then the 5 bytes of its stream dependency
    /// (RFC 9113, section 6.3).
    pub fn encode<B: BufMut>(&self, dst: &mut B) {
        tracing::trace!("encoding PRIORITY; id={:?}", self.stream_id);
        let head = Head::new(Kind::Priority, 0, self.stream_id);
        head.encode(5, dst);
        self.dependency.encode(dst);
    }
}

impl<B> From<Priority> for Frame<B> {
    fn from(src: Priority) -> Self {
        Frame::Priority(src)
    }
}

// ===== impl StreamDependency =====

impl StreamDependency {
    pub fn new(dependency_id: StreamId, weight: u8, is_exclusive: bool) -> Self {
        StreamDependency {
            dependency_id,
            weight,
            is_exclusive,
        }
    }

    pub fn load(src: &[u8]) -> Result<Self, Error> {
        if src.len() != 5 {
            return Err(Error::InvalidPayloadLength);
        }

        // Parse the stream ID and exclusive flag
        let (dependency_id, is_exclusive) = StreamId::parse(&src[..4]);

        // Read the weight
        let weight = src[4];

        Ok(StreamDependency::new(dependency_id, weight, is_exclusive))
    }

    pub fn dependency_id(&self) -> StreamId {
        self.dependency_id
    }

    /// The 5 bytes `load` reads: the exclusive flag and the dependency's stream ID in
    /// 4 bytes, then the weight.
    pub fn encode<B: BufMut>(&self, dst: &mut B) {
        let exclusive = if self.is_exclusive { 1 << 31 } else { 0 };
        dst.put_u32(u32::from(self.dependency_id) | exclusive);
        dst.put_u8(self.weight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoded_priority_frame_loads_back_as_it_was() {
        for (dependency, weight, exclusive) in [(0, 15, false), (3, 255, true), (0x7fff_fffd, 0, true)] {
            let frame = Priority {
                stream_id: StreamId::from(7),
                dependency: StreamDependency::new(StreamId::from(dependency), weight, exclusive),
            };
            let mut buf = Vec::new();
            frame.encode(&mut buf);
            assert_eq!(buf.len(), 9 + 5);
            let head = Head::parse(&buf);
            assert_eq!(head.kind(), Kind::Priority);
            assert_eq!(head.stream_id(), StreamId::from(7));
            assert_eq!(u32::from_be_bytes([0, buf[0], buf[1], buf[2]]), 5);
            assert_eq!(Priority::load(head, &buf[9..]).unwrap(), frame);
        }
    }
}
