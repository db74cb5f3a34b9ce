//! A tonic codec that encodes the request with prost and hands back the response's
//! bytes undecoded: the global relist's two list calls read them in place
//! ([`crate::list_wire`]). The decoding limit (`--runtime-max-message-size`) is
//! tonic's, checked before the codec sees the message.

use std::marker::PhantomData;

use prost::bytes::{Buf, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::ProstEncoder;

/// Requests of type `Req`, responses as bytes.
pub struct RawCodec<Req>(PhantomData<Req>);

impl<Req> Default for RawCodec<Req> {
    fn default() -> Self {
        RawCodec(PhantomData)
    }
}

impl<Req: prost::Message + Send + 'static> Codec for RawCodec<Req> {
    type Encode = Req;
    type Decode = Bytes;
    type Encoder = ProstEncoder<Req>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

/// Takes the message's bytes as they are (without copying them: tonic's buffer is
/// split).
pub struct RawDecoder;

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let len = buf.remaining();
        Ok(Some(buf.copy_to_bytes(len)))
    }
}
