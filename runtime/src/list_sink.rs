//! The global relist's ListContainers read as it arrives, never held whole.
//!
//! tonic gathers a response's message into one buffer before it decodes it: at
//! 10,000 realistic pods, 17 MB mapped, faulted in, cleared and unmapped every
//! relist (plegd fixes glibc's thresholds so that such buffers leave its RSS when
//! freed: docs/architecture.md, "Performance decisions"). Here a layer under tonic
//! ([`SinkChannel`]) hands the message of a call that asks for it ([`Sink`], in the
//! request's extensions) to [`ContainerSink`] frame by frame, as HTTP/2 delivers it,
//! and gives tonic an empty message in its place: tonic still makes the call and
//! judges its headers, trailers, status, limit and compression, as for any call.
//! The sink splits the message into its entries and reads each as
//! [`crate::list_wire`] does (with the list memo), keeping only the fields plegd
//! uses ([`ContainerList`]): ≈ 150 bytes an entry instead of ≈ 850.
//!
//! A message the sink does not take (over the size limit, compressed) goes through
//! unchanged, for tonic to refuse or decode as before. A top-level field other than
//! an entry in its plain form is not split: it and the rest of the message are
//! kept whole and read at the end exactly as [`crate::list_wire`] reads a whole
//! response, so what is accepted and refused stays prost's.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};

use futures::future::BoxFuture;
use http_body::{Body, Frame, SizeHint};
use prost::bytes::{Bytes, BytesMut};

use crate::list_memo::ListMemo;
use crate::list_wire::{self, ContainerFields, WireError};
use crate::NodeLists;

/// The key of a `ListContainersResponse` entry (field 1, length-delimited) in its one
/// plain byte.
const ENTRY_KEY: u8 = 0x0a;

/// What a call's response message is given to, shared by the caller (who reads the
/// outcome) and the response's body.
#[derive(Clone, Default)]
pub(crate) struct Sink {
    reader: Arc<Mutex<ContainerSink>>,
    /// The response is a stream of messages (CRI's StreamContainers), not one.
    streamed: bool,
}

impl Sink {
    /// A sink for a message of at most `limit` bytes (the call's decoding limit: one
    /// over it goes to tonic, which refuses it as it would have), read with `memo`'s
    /// containers part (taken: [`Sink::into_outcome`] gives it back).
    pub(crate) fn new(limit: usize, memo: &mut ListMemo) -> Self {
        Self::reading(limit, memo, false)
    }

    /// A sink for every message of a StreamContainers response, each of at most
    /// `limit` bytes and read on its own (a message that ends inside a field is
    /// refused, as prost refuses it), their entries read as one list. A message
    /// the sink does not take goes to tonic, and so does every message after it.
    pub(crate) fn streamed(limit: usize, memo: &mut ListMemo) -> Self {
        Self::reading(limit, memo, true)
    }

    fn reading(limit: usize, memo: &mut ListMemo, streamed: bool) -> Self {
        let sink = ContainerSink {
            limit,
            memo: std::mem::take(memo),
            streamed,
            ..ContainerSink::default()
        };
        Sink {
            reader: Arc::new(Mutex::new(sink)),
            streamed,
        }
    }

    fn lock(&self) -> MutexGuard<'_, ContainerSink> {
        // A panic while reading leaves nothing half-done that matters: the outcome
        // is then an error or incomplete.
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// After the call: the memo back into `memo`, and the containers if the sink took
    /// the whole message, or every message of a stream (None: it took none, the
    /// call's own bytes hold them).
    pub(crate) fn into_outcome(
        self,
        memo: &mut ListMemo,
    ) -> Option<Result<ContainerList, WireError>> {
        let mut sink = self.lock();
        *memo = std::mem::take(&mut sink.memo);
        match std::mem::take(&mut sink.state) {
            State::Idle => None,
            State::Done(outcome) => Some(outcome),
            State::Reading { .. } => Some(Err("the response ended inside its message".into())),
        }
    }
}

/// The containers plegd reads of a `ListContainersResponse`, packed: their strings
/// in one block.
#[derive(Clone, Debug, Default)]
pub struct ContainerList {
    text: String,
    entries: Vec<Packed>,
}

#[derive(Clone, Copy, Debug)]
struct Packed {
    /// Where the ID, the sandbox ID and the name end in `text` (each starts where the
    /// one before ends).
    ends: [u32; 3],
    attempt: u32,
    state: i32,
    created_at: i64,
}

impl ContainerList {
    /// Adds an entry's fields (false if the block would outgrow u32 offsets).
    fn push(&mut self, f: &ContainerFields<'_>) -> bool {
        let mut ends = [0u32; 3];
        for (end, s) in ends.iter_mut().zip([f.id, f.sandbox_id, f.name]) {
            self.text.push_str(s);
            match u32::try_from(self.text.len()) {
                Ok(at) => *end = at,
                Err(_) => return false,
            }
        }
        self.entries.push(Packed {
            ends,
            attempt: f.attempt,
            state: f.state,
            created_at: f.created_at,
        });
        true
    }

    /// The entries, as [`list_wire::containers`] reads them.
    pub(crate) fn iter(&self) -> impl Iterator<Item = ContainerFields<'_>> {
        let mut start = 0;
        self.entries.iter().map(move |e| {
            let [id, sandbox_id, name] = e.ends.map(|end| {
                let s = &self.text[start..end as usize];
                start = end as usize;
                s
            });
            ContainerFields {
                id,
                sandbox_id,
                name,
                attempt: e.attempt,
                state: e.state,
                created_at: e.created_at,
            }
        })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether its room is at most three times what it holds (a small list's is
    /// left alone).
    pub(crate) fn fits(&self) -> bool {
        const MIN_ENTRIES: usize = 256;
        self.entries.capacity() <= 3 * self.entries.len().max(MIN_ENTRIES)
            && self.text.capacity() <= 3 * self.text.len().max(64 * MIN_ENTRIES)
    }

    pub(crate) fn clear(&mut self) {
        self.text.clear();
        self.entries.clear();
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.text.capacity() + self.entries.capacity() * std::mem::size_of::<Packed>()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[derive(Default)]
enum State {
    /// No message taken (yet).
    #[default]
    Idle,
    Reading {
        list: ContainerList,
        /// The part of a top-level field that came so far (a field split between
        /// frames), or with `whole`, every byte from the first field not split.
        carry: Vec<u8>,
        whole: bool,
        /// Message bytes not yet given.
        left: usize,
        error: Option<WireError>,
    },
    Done(Result<ContainerList, WireError>),
}

/// Reads a `ListContainersResponse` given in pieces (or a stream of messages of its
/// shape, appended).
#[derive(Default)]
pub(crate) struct ContainerSink {
    limit: usize,
    memo: ListMemo,
    state: State,
    streamed: bool,
}

/// Where the first top-level field of `buf` ends, if it is an entry in its plain
/// form.
enum Extent {
    /// An entry: its key and length take `head` bytes, its message `len`.
    Entry { head: usize, len: usize },
    /// More bytes are needed to tell.
    Short,
    /// Anything else: read the rest whole.
    Other,
}

fn extent(buf: &[u8], left: usize) -> Extent {
    match buf.first() {
        None => return Extent::Short,
        Some(&ENTRY_KEY) => {}
        Some(_) => return Extent::Other,
    }
    let len = &buf[1..];
    // A varint ends at its first byte under 0x80, within 10 bytes.
    let Some(end) = len.iter().take(10).position(|&b| b < 0x80) else {
        return if len.len() < 10 {
            Extent::Short
        } else {
            Extent::Other
        };
    };
    let mut digits = &len[..=end];
    match prost::encoding::decode_varint(&mut digits) {
        Ok(n) if n <= (left - 2 - end) as u64 => Extent::Entry {
            head: 2 + end,
            len: n as usize,
        },
        _ => Extent::Other,
    }
}

impl ContainerSink {
    /// The call's message is `len` bytes: whether the sink takes it.
    fn begin(&mut self, len: usize) -> bool {
        if len > self.limit {
            return false;
        }
        let list = match std::mem::take(&mut self.state) {
            State::Idle => std::mem::take(&mut self.memo.room.list),
            // The next message of a stream: its entries are appended.
            State::Done(Ok(list)) if self.streamed => list,
            // A stream already refused: its later messages are taken and dropped.
            State::Done(Err(e)) if self.streamed => {
                self.state = State::Done(Err(e));
                return true;
            }
            other => {
                self.state = other;
                return false;
            }
        };
        self.state = State::Reading {
            list,
            carry: Vec::new(),
            whole: false,
            left: len,
            error: None,
        };
        self.end_if_read();
        true
    }

    /// The next bytes of the message.
    fn feed(&mut self, mut data: &[u8]) {
        let State::Reading {
            list,
            carry,
            whole,
            left,
            error,
        } = &mut self.state
        else {
            return;
        };
        let mut each = |entry: &[u8]| {
            if error.is_some() {
                return;
            }
            if let Err(e) = read_entry(entry, &mut self.memo, list) {
                *error = Some(e);
            }
        };
        // `left` counts the message bytes after `carry`'s and `data`'s.
        *left -= data.len();
        if *whole {
            carry.extend_from_slice(data);
        } else {
            // A field split between frames: complete it first.
            while !carry.is_empty() && !*whole {
                let seen = carry.len();
                match extent(carry, seen + data.len() + *left) {
                    Extent::Short => {
                        let Some((&b, rest)) = data.split_first() else {
                            break;
                        };
                        carry.push(b);
                        data = rest;
                    }
                    Extent::Other => *whole = true,
                    Extent::Entry { head, len } => {
                        let need = head + len - seen;
                        if need > data.len() {
                            carry.extend_from_slice(data);
                            data = &[];
                            break;
                        }
                        carry.extend_from_slice(&data[..need]);
                        data = &data[need..];
                        each(&carry[head..]);
                        carry.clear();
                    }
                }
            }
            if *whole {
                carry.extend_from_slice(data);
            } else {
                while !data.is_empty() {
                    match extent(data, data.len() + *left) {
                        Extent::Entry { head, len } if head + len <= data.len() => {
                            each(&data[head..head + len]);
                            data = &data[head + len..];
                        }
                        Extent::Entry { .. } | Extent::Short => {
                            carry.extend_from_slice(data);
                            break;
                        }
                        Extent::Other => {
                            *whole = true;
                            carry.extend_from_slice(data);
                            break;
                        }
                    }
                }
            }
        }
        self.end_if_read();
    }

    /// Once every byte of the message came: the outcome.
    fn end_if_read(&mut self) {
        let State::Reading { left: 0, .. } = self.state else {
            return;
        };
        let State::Reading {
            mut list,
            carry,
            whole,
            error,
            ..
        } = std::mem::take(&mut self.state)
        else {
            return;
        };
        let outcome = match error {
            Some(e) => Err(e),
            // The rest of the message, whole (or a field the message's end cut
            // short): read as a response of its own (its fields are read in order; a
            // repeated field only appends), with prost's verdict.
            None if whole || !carry.is_empty() => list_wire::container_entries(&carry, |entry| {
                read_entry(entry, &mut self.memo, &mut list)
            })
            .map(|()| list),
            None => Ok(list),
        };
        self.state = State::Done(outcome);
    }
}

/// One entry, read with the memo's containers part, and kept (the view leaves out
/// those plegd cannot attribute, as for any list).
fn read_entry(
    entry: &[u8],
    memo: &mut ListMemo,
    list: &mut ContainerList,
) -> Result<(), WireError> {
    let f = list_wire::container_entry(entry, Some(&mut memo.containers))?;
    if list.push(&f) {
        Ok(())
    } else {
        Err("the list's strings are over 4 GiB".into())
    }
}

/// A channel whose calls may carry a [`Sink`] for their response's message.
#[derive(Clone, Debug)]
pub(crate) struct SinkChannel<S>(pub(crate) S);

impl<S, B> tower::Service<http::Request<tonic::body::Body>> for SinkChannel<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
{
    type Response = http::Response<SinkBody<B>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<tonic::body::Body>) -> Self::Future {
        let sink = req.extensions_mut().remove::<Sink>();
        let call = self.0.call(req);
        Box::pin(async move {
            let resp = call.await?;
            Ok(resp.map(|inner| SinkBody {
                inner,
                sink,
                phase: Phase::Prefix {
                    head: [0; 5],
                    got: 0,
                },
                out: None,
            }))
        })
    }
}

/// Where a response body is in its (one) gRPC message.
enum Phase {
    /// The message's 5-byte prefix (compression flag, length), `got` of them so far.
    Prefix { head: [u8; 5], got: usize },
    /// In the message the sink takes: bytes left.
    Message(usize),
    /// Everything else goes through.
    Through,
}

/// A response body whose message, if its call carried a [`Sink`] that takes it, goes
/// to the sink; tonic gets an empty message in its place.
pub(crate) struct SinkBody<B> {
    inner: B,
    sink: Option<Sink>,
    phase: Phase,
    /// Bytes for tonic, before the next frame.
    out: Option<Bytes>,
}

impl<B> SinkBody<B> {
    /// The bytes of a data frame: what tonic gets of them (None: nothing yet).
    fn take(&mut self, mut data: Bytes) -> Option<Bytes> {
        let Some(sink) = &self.sink else {
            return Some(data);
        };
        let mut out = BytesMut::new();
        loop {
            match &mut self.phase {
                Phase::Through => {
                    out.extend_from_slice(&data);
                    break;
                }
                Phase::Prefix { head, got } => {
                    let n = (5 - *got).min(data.len());
                    head[*got..*got + n].copy_from_slice(&data[..n]);
                    *got += n;
                    let _ = data.split_to(n);
                    if *got < 5 {
                        break;
                    }
                    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
                    if head[0] == 0 && sink.lock().begin(len) {
                        // An empty, uncompressed message in its place.
                        out.extend_from_slice(&[0; 5]);
                        self.phase = Phase::Message(len);
                    } else {
                        out.extend_from_slice(head);
                        self.phase = Phase::Through;
                    }
                }
                Phase::Message(left) => {
                    let n = (*left).min(data.len());
                    if n > 0 {
                        sink.lock().feed(&data[..n]);
                    }
                    *left -= n;
                    let _ = data.split_to(n);
                    if *left > 0 {
                        break;
                    }
                    self.phase = if sink.streamed {
                        Phase::Prefix {
                            head: [0; 5],
                            got: 0,
                        }
                    } else {
                        Phase::Through
                    };
                }
            }
        }
        (!out.is_empty()).then(|| out.freeze())
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for SinkBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        loop {
            if let Some(out) = self.out.take() {
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
            let frame = match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                other => return Poll::Ready(other),
            };
            match frame.into_data() {
                Ok(data) => self.out = self.take(data),
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.out.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// The message `bytes` given to a sink in pieces cut at `cuts` (ascending offsets),
/// as frames would give it; the outcome, the memo's read left unfinished.
pub(crate) fn sunk_in_pieces(
    bytes: &[u8],
    cuts: &[usize],
    memo: &mut ListMemo,
) -> Result<ContainerList, WireError> {
    let sink = Sink::new(usize::MAX, memo);
    sink.lock().begin(bytes.len());
    let mut from = 0;
    for &cut in cuts.iter().chain([&bytes.len()]) {
        sink.lock().feed(&bytes[from..cut]);
        from = cut;
    }
    sink.into_outcome(memo)
        .unwrap_or_else(|| Err("the sink took no message".into()))
}

impl NodeLists {
    /// The lists as [`crate::CriRuntime::list_node_memo`] makes them of the two
    /// responses' messages: ListContainers's given to its reader in `frame`-byte
    /// pieces, as HTTP/2 delivers it, with `memo` (for tests and benchmarks of that
    /// path). A refused message ends the memo's read.
    pub fn sunk(
        sandboxes: Bytes,
        containers: &[u8],
        frame: usize,
        memo: &mut ListMemo,
    ) -> Result<NodeLists, crate::RuntimeError> {
        let cuts: Vec<usize> = (frame.max(1)..containers.len())
            .step_by(frame.max(1))
            .collect();
        match sunk_in_pieces(containers, &cuts, memo) {
            Ok(containers) => Ok(NodeLists::Sunk {
                sandboxes: vec![sandboxes],
                containers,
            }),
            Err(reason) => {
                memo.finish(false);
                Err(crate::RuntimeError::Invalid {
                    op: "ListContainers",
                    reason,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::convert::Infallible;

    use prost::Message as _;

    use crate::cri;

    /// A body that gives these frames.
    struct Frames(VecDeque<Frame<Bytes>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }

    /// What tonic gets of `frames` through a [`SinkBody`]: the data, and the trailers.
    fn through(
        frames: Vec<Frame<Bytes>>,
        sink: Option<Sink>,
    ) -> (Vec<u8>, Option<http::HeaderMap>) {
        let mut body = SinkBody {
            inner: Frames(frames.into()),
            sink,
            phase: Phase::Prefix {
                head: [0; 5],
                got: 0,
            },
            out: None,
        };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let (mut data, mut trailers) = (Vec::new(), None);
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            match frame.expect("infallible").into_data() {
                Ok(bytes) => data.extend_from_slice(&bytes),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        (data, trailers)
    }

    /// A `ListContainersResponse` of the containers numbered `ids`, as a gRPC message
    /// (its 5-byte prefix first) flagged `compressed`.
    fn framed(ids: std::ops::Range<usize>, compressed: u8) -> Vec<u8> {
        let message = cri::ListContainersResponse {
            containers: ids
                .map(|i| cri::Container {
                    id: format!("c{i}"),
                    pod_sandbox_id: format!("s{i}"),
                    state: 1,
                    ..Default::default()
                })
                .collect(),
        }
        .encode_to_vec();
        let mut bytes = vec![compressed];
        bytes.extend_from_slice(&(message.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&message);
        bytes
    }

    /// A gRPC message of `ListContainersResponse` with `n` containers, flagged
    /// `compressed`, cut into frames of `size` bytes, then trailers.
    fn response(n: usize, compressed: u8, size: usize) -> (Vec<u8>, Vec<Frame<Bytes>>) {
        let bytes = framed(0..n, compressed);
        let mut frames: Vec<Frame<Bytes>> = bytes
            .chunks(size)
            .map(|c| Frame::data(Bytes::copy_from_slice(c)))
            .collect();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        frames.push(Frame::trailers(trailers));
        (bytes, frames)
    }

    #[test]
    fn the_sink_takes_the_message_and_tonic_gets_an_empty_one_and_the_trailers() {
        for size in [1, 3, 5, 7, 64, 1 << 20] {
            let (_, frames) = response(50, 0, size);
            let mut memo = ListMemo::default();
            let sink = Sink::new(1 << 20, &mut memo);
            let (data, trailers) = through(frames, Some(sink.clone()));
            assert_eq!(data, [0; 5], "frames of {size}");
            assert!(trailers.is_some_and(|t| t["grpc-status"] == "0"));
            let list = sink.into_outcome(&mut memo).expect("taken").expect("valid");
            let ids: Vec<_> = list.iter().map(|c| c.id).collect();
            assert_eq!(ids.len(), 50);
            assert_eq!(ids[49], "c49");
            assert_eq!(list.iter().nth(7).map(|c| c.sandbox_id), Some("s7"));
        }
    }

    /// gRPC messages of `ListContainersResponse`s of `sizes` containers each (IDs
    /// numbered on), flagged `compressed`: the framed bytes, and the IDs.
    fn stream(sizes: &[usize], compressed: u8) -> (Vec<u8>, Vec<String>) {
        let (mut bytes, mut ids) = (Vec::new(), Vec::new());
        for &n in sizes {
            let first = ids.len();
            ids.extend((first..first + n).map(|i| format!("c{i}")));
            bytes.extend_from_slice(&framed(first..first + n, compressed));
        }
        (bytes, ids)
    }

    /// `bytes` cut at `cuts` into data frames, then trailers.
    fn frames_of(bytes: &[u8], cuts: &[usize]) -> Vec<Frame<Bytes>> {
        let mut frames = Vec::new();
        let mut from = 0;
        for &cut in cuts.iter().chain([&bytes.len()]) {
            frames.push(Frame::data(Bytes::copy_from_slice(&bytes[from..cut])));
            from = cut;
        }
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        frames.push(Frame::trailers(trailers));
        frames
    }

    #[test]
    fn a_streamed_sink_reads_every_message_of_a_stream_as_one_list() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut below = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for round in 0..300 {
            let sizes: Vec<usize> = (0..1 + below(5)).map(|_| below(4)).collect();
            let (bytes, ids) = stream(&sizes, 0);
            // Frames cut anywhere: inside a prefix, a message, across messages.
            let mut cuts: Vec<usize> = (0..below(12)).map(|_| below(bytes.len() + 1)).collect();
            cuts.sort_unstable();
            let mut memo = ListMemo::default();
            let sink = Sink::streamed(1 << 20, &mut memo);
            let (data, trailers) = through(frames_of(&bytes, &cuts), Some(sink.clone()));
            assert_eq!(
                data,
                vec![0; 5 * sizes.len()],
                "round {round}: one empty message each"
            );
            assert!(trailers.is_some());
            let list = sink.into_outcome(&mut memo).expect("taken").expect("valid");
            let got: Vec<_> = list.iter().map(|c| c.id.to_string()).collect();
            assert_eq!(got, ids, "round {round}: {sizes:?} cut at {cuts:?}");
        }
    }

    /// A message whose fields are not all entries is read whole at its end (as
    /// prost reads it), and the next message is split into entries again.
    #[test]
    fn a_streamed_message_read_whole_is_followed_by_one_split() {
        let (first, mut ids) = stream(&[2], 0);
        // Field 2, a varint, before the entries: not an entry, so the rest of this
        // message is kept whole.
        let mut odd = vec![0x10, 0x07];
        odd.extend_from_slice(&first[5..]);
        let mut bytes = vec![0];
        bytes.extend_from_slice(&(odd.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&odd);
        let (next, _) = stream(&[3], 0);
        bytes.extend_from_slice(&next);
        // The second message's IDs are numbered from 0 too.
        ids.extend((0..3).map(|i| format!("c{i}")));
        for cuts in [vec![], vec![6, 30, 61], (1..bytes.len()).collect()] {
            let mut memo = ListMemo::default();
            let sink = Sink::streamed(1 << 20, &mut memo);
            let (data, _) = through(frames_of(&bytes, &cuts), Some(sink.clone()));
            assert_eq!(data, [0; 10]);
            let list = sink.into_outcome(&mut memo).expect("taken").expect("valid");
            let got: Vec<_> = list.iter().map(|c| c.id.to_string()).collect();
            assert_eq!(got, ids);
        }
    }

    #[test]
    fn a_streamed_message_that_ends_inside_a_field_is_refused() {
        // The first message's last entry cut short by its own length: the next
        // message's bytes must not complete it.
        let (whole, _) = stream(&[2], 0);
        let message = &whole[5..];
        let short = &message[..message.len() - 3];
        let mut bytes = vec![0];
        bytes.extend_from_slice(&(short.len() as u32).to_be_bytes());
        bytes.extend_from_slice(short);
        bytes.extend_from_slice(&whole);
        let mut memo = ListMemo::default();
        let sink = Sink::streamed(1 << 20, &mut memo);
        let (data, _) = through(frames_of(&bytes, &[7, 40]), Some(sink.clone()));
        assert_eq!(data, [0; 10]);
        assert!(sink.into_outcome(&mut memo).expect("taken").is_err());
    }

    #[test]
    fn a_streamed_message_the_sink_does_not_take_goes_through_with_every_later_one() {
        let (first, _) = stream(&[2], 0);
        let (big, _) = stream(&[40], 0);
        let (last, _) = stream(&[3], 0);
        let bytes = [first.clone(), big.clone(), last.clone()].concat();
        let mut memo = ListMemo::default();
        // Over the limit: the second message (tonic refuses it, as it would have).
        let sink = Sink::streamed(big.len() - 6, &mut memo);
        let (data, _) = through(frames_of(&bytes, &[3, 100]), Some(sink.clone()));
        assert_eq!(data, [&[0; 5][..], &big, &last].concat());
        // The sink holds the first message's entries alone: the call's outcome is
        // tonic's verdict on the rest (its limit refuses the second).
        let list = sink.into_outcome(&mut memo).expect("taken").expect("valid");
        assert_eq!(list.len(), 2);
        // Compressed: the same.
        let (zipped, _) = stream(&[2], 1);
        let bytes = [first, zipped.clone(), last.clone()].concat();
        let sink = Sink::streamed(1 << 20, &mut memo);
        let (data, _) = through(frames_of(&bytes, &[]), Some(sink.clone()));
        assert_eq!(data, [&[0; 5][..], &zipped, &last].concat());
        let list = sink.into_outcome(&mut memo).expect("taken").expect("valid");
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn a_message_over_the_limit_compressed_or_without_a_sink_goes_through_unchanged() {
        let (bytes, frames) = response(50, 0, 7);
        let mut memo = ListMemo::default();
        // One byte under the message's length.
        let small = Sink::new(bytes.len() - 6, &mut memo);
        assert_eq!(through(frames, Some(small.clone())).0, bytes);
        assert!(small.into_outcome(&mut memo).is_none());
        let (bytes, frames) = response(50, 1, 7);
        let sink = Sink::new(1 << 20, &mut memo);
        assert_eq!(through(frames, Some(sink.clone())).0, bytes);
        assert!(sink.into_outcome(&mut memo).is_none());
        let (bytes, frames) = response(50, 0, 7);
        assert_eq!(through(frames, None).0, bytes);
    }

    #[test]
    fn a_response_that_ends_inside_its_message_is_an_error() {
        let (_, mut frames) = response(50, 0, 100);
        frames.truncate(3);
        let mut memo = ListMemo::default();
        let sink = Sink::new(1 << 20, &mut memo);
        let (data, _) = through(frames, Some(sink.clone()));
        assert_eq!(data, [0; 5]);
        assert!(sink.into_outcome(&mut memo).expect("taken").is_err());
    }

    #[test]
    fn the_memo_goes_back_to_its_owner() {
        let (_, frames) = response(3, 0, 10);
        let mut memo = ListMemo::default();
        let sink = Sink::new(1 << 20, &mut memo);
        through(frames, Some(sink.clone()));
        assert!(memo.is_empty(), "lent to the sink");
        sink.into_outcome(&mut memo).expect("taken").expect("valid");
        memo.finish(true);
        assert_eq!(
            memo.len().1,
            1,
            "three entries alike but for the fields read: one fingerprint"
        );
    }
}
