//! The global relist's two lists read as they arrive, never held whole.
//!
//! tonic gathers a response's message into one buffer before it decodes it: at
//! 10,000 realistic pods, 17 MB for ListContainers and 4.5 MB for ListPodSandbox
//! mapped, faulted in, cleared and unmapped every relist (plegd fixes glibc's
//! thresholds so that such buffers leave its RSS when freed: docs/architecture.md,
//! "Performance decisions"). Here a layer under tonic ([`SinkChannel`]) hands the
//! message of a call that asks for it ([`Sink`], in the request's extensions) to
//! [`ListSink`] frame by frame, as HTTP/2 delivers it, and gives tonic an empty
//! message in its place: tonic still makes the call and judges its headers,
//! trailers, status, limit and compression, as for any call. The sink splits the
//! message into its entries and reads each as [`crate::list_wire`] does (with the
//! list memo), keeping only the fields plegd uses ([`crate::packed_lists`]).
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

use crate::list_memo::{EntryMemo, ListMemo};
use crate::list_wire::{self, WireError};
use crate::packed_lists::{ContainerList, PackedList, SandboxList};
use crate::NodeLists;

/// The key of a list response's entry (field 1, length-delimited) in its one plain
/// byte: `ListPodSandboxResponse`, `ListContainersResponse` and their streamed
/// counterparts alike.
const ENTRY_KEY: u8 = 0x0a;

/// A call's response message read into an `L` as it arrives: the caller's handle
/// (it reads the outcome); [`Sink::taker`] goes with the request.
pub(crate) struct Sink<L> {
    reader: Arc<Mutex<ListSink<L>>>,
    streamed: bool,
}

impl<L: PackedList> Sink<L> {
    /// A sink for a message of at most `limit` bytes (the call's decoding limit: one
    /// over it goes to tonic, which refuses it as it would have), read with `memo`'s
    /// part for `L` (taken: [`Sink::into_outcome`] gives it back).
    pub(crate) fn new(limit: usize, memo: &mut ListMemo) -> Self {
        Self::reading(limit, memo, false)
    }

    /// A sink for every message of a streamed list response, each of at most
    /// `limit` bytes and read on its own (a message that ends inside a field is
    /// refused, as prost refuses it), their entries read as one list. A message
    /// the sink does not take goes to tonic, and so does every message after it.
    pub(crate) fn streamed(limit: usize, memo: &mut ListMemo) -> Self {
        Self::reading(limit, memo, true)
    }

    fn reading(limit: usize, memo: &mut ListMemo, streamed: bool) -> Self {
        let (entries, kept) = L::parts(memo);
        let sink = ListSink {
            limit,
            memo: std::mem::take(entries),
            kept: std::mem::take(kept),
            streamed,
            state: State::Idle,
        };
        Sink {
            reader: Arc::new(Mutex::new(sink)),
            streamed,
        }
    }

    fn lock(&self) -> MutexGuard<'_, ListSink<L>> {
        // A panic while reading leaves nothing half-done that matters: the outcome
        // is then an error or incomplete.
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What goes in the call's request extensions.
    pub(crate) fn taker(&self) -> Taker {
        Taker {
            reader: self.reader.clone(),
            streamed: self.streamed,
        }
    }

    /// After the call: the memo's part back into `memo`, and the list if the sink
    /// took the whole message, or every message of a stream (None: it took none,
    /// the call's own bytes hold them).
    pub(crate) fn into_outcome(self, memo: &mut ListMemo) -> Option<Result<L, WireError>> {
        let mut sink = self.lock();
        let (entries, kept) = L::parts(memo);
        *entries = std::mem::take(&mut sink.memo);
        // The kept list, if no message took it.
        *kept = std::mem::take(&mut sink.kept);
        match std::mem::replace(&mut sink.state, State::Idle) {
            State::Idle => None,
            State::Done(outcome) => Some(outcome),
            State::Reading { .. } => Some(Err("the response ended inside its message".into())),
        }
    }
}

impl<L: PackedList> Sink<L> {
    /// What a call `op` with this sink read, given the messages tonic gave back
    /// (`called`: one for a unary call); the memo's part back in `memo`. A message
    /// the sink did not take (compressed) is read from tonic's bytes the same way,
    /// after the ones it took (only later messages of a stream go past it).
    pub(crate) fn outcome(
        self,
        op: &'static str,
        called: Result<Vec<Bytes>, crate::RuntimeError>,
        memo: &mut ListMemo,
    ) -> Result<L, crate::RuntimeError> {
        let streamed = self.streamed;
        let outcome = self.into_outcome(memo);
        let messages = called?;
        let invalid = |reason| crate::RuntimeError::Invalid { op, reason };
        let through = messages.iter().filter(|m| !m.is_empty());
        let mut list = match outcome {
            Some(Err(reason)) => return Err(invalid(reason)),
            Some(Ok(_)) if !streamed && through.clone().next().is_some() => {
                return Err(invalid("more than one message in a unary response".into()))
            }
            Some(Ok(list)) => list,
            None => std::mem::take(L::parts(memo).1),
        };
        let part = L::parts(memo).0;
        for message in through {
            list_wire::list_entries(message, |entry| list.read(entry, part)).map_err(invalid)?;
        }
        Ok(list)
    }
}

/// A sink as the response's body sees it, whatever list it reads.
#[derive(Clone)]
pub(crate) struct Taker {
    reader: Arc<Mutex<dyn Reader>>,
    /// The response is a stream of messages, not one.
    streamed: bool,
}

impl Taker {
    fn lock(&self) -> MutexGuard<'_, dyn Reader + 'static> {
        self.reader.lock().unwrap_or_else(|p| p.into_inner())
    }
}

trait Reader: Send {
    /// The call's message is `len` bytes: whether the sink takes it.
    fn begin(&mut self, len: usize) -> bool;
    /// The next bytes of the message.
    fn feed(&mut self, data: &[u8]);
}

enum State<L> {
    /// No message taken (yet).
    Idle,
    Reading {
        list: L,
        /// The part of a top-level field that came so far (a field split between
        /// frames), or with `whole`, every byte from the first field not split.
        carry: Vec<u8>,
        whole: bool,
        /// Message bytes not yet given.
        left: usize,
        error: Option<WireError>,
    },
    Done(Result<L, WireError>),
}

/// Reads a list response given in pieces (or a stream of messages of its shape,
/// appended) into an `L`.
pub(crate) struct ListSink<L> {
    limit: usize,
    /// The memo's part for `L`.
    memo: EntryMemo,
    /// The list the last read left to fill again.
    kept: L,
    state: State<L>,
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
    let (end, n) = match *len {
        // A length of one or two bytes (an entry under 16 KiB) without prost's
        // general path.
        [b0 @ 0..=0x7f, ..] => (0, u64::from(b0)),
        [b0, b1 @ 0..=0x7f, ..] => (1, u64::from(b0 & 0x7f) | u64::from(b1) << 7),
        _ => {
            // A varint ends at its first byte under 0x80, within 10 bytes.
            let Some(end) = len.iter().take(10).position(|&b| b < 0x80) else {
                return if len.len() < 10 {
                    Extent::Short
                } else {
                    Extent::Other
                };
            };
            match prost::encoding::decode_varint(&mut &len[..=end]) {
                Ok(n) => (end, n),
                Err(_) => return Extent::Other,
            }
        }
    };
    match n <= (left - 2 - end) as u64 {
        true => Extent::Entry {
            head: 2 + end,
            len: n as usize,
        },
        false => Extent::Other,
    }
}

impl<L: PackedList> Reader for ListSink<L> {
    fn begin(&mut self, len: usize) -> bool {
        if len > self.limit {
            return false;
        }
        let list = match std::mem::replace(&mut self.state, State::Idle) {
            State::Idle => std::mem::take(&mut self.kept),
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
            if let Err(e) = list.read(entry, &mut self.memo) {
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
}

impl<L: PackedList> ListSink<L> {
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
        } = std::mem::replace(&mut self.state, State::Idle)
        else {
            return;
        };
        let outcome = match error {
            Some(e) => Err(e),
            // The rest of the message, whole (or a field the message's end cut
            // short): read as a response of its own (its fields are read in order; a
            // repeated field only appends), with prost's verdict.
            None if whole || !carry.is_empty() => {
                list_wire::list_entries(&carry, |entry| list.read(entry, &mut self.memo))
                    .map(|()| list)
            }
            None => Ok(list),
        };
        self.state = State::Done(outcome);
    }
}

/// A channel whose calls may carry a [`Sink`]'s [`Taker`] for their response's
/// message.
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
        let sink = req.extensions_mut().remove::<Taker>();
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

/// A response body whose message, if its call carried a [`Taker`] that takes it, goes
/// to its sink; tonic gets an empty message in its place.
pub(crate) struct SinkBody<B> {
    inner: B,
    sink: Option<Taker>,
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
pub(crate) fn sunk_in_pieces<L: PackedList>(
    bytes: &[u8],
    cuts: &[usize],
    memo: &mut ListMemo,
) -> Result<L, WireError> {
    let sink = Sink::<L>::new(usize::MAX, memo);
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
    /// responses' messages: each given to its reader in `frame`-byte pieces, as
    /// HTTP/2 delivers it, with `memo` (for tests and benchmarks of that path). A
    /// refused message ends the memo's read.
    pub fn sunk(
        sandboxes: &[u8],
        containers: &[u8],
        frame: usize,
        memo: &mut ListMemo,
    ) -> Result<NodeLists, crate::RuntimeError> {
        let frame = frame.max(1);
        let cuts = |len: usize| (frame..len).step_by(frame).collect::<Vec<usize>>();
        let read = sunk_in_pieces::<SandboxList>(sandboxes, &cuts(sandboxes.len()), memo)
            .map_err(|reason| ("ListPodSandbox", reason))
            .and_then(|sandboxes| {
                sunk_in_pieces::<ContainerList>(containers, &cuts(containers.len()), memo)
                    .map(|containers| NodeLists::Sunk {
                        sandboxes,
                        containers,
                    })
                    .map_err(|reason| ("ListContainers", reason))
            });
        read.map_err(|(op, reason)| {
            memo.finish(false);
            crate::RuntimeError::Invalid { op, reason }
        })
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
        sink: Option<Taker>,
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
            let sink = Sink::<ContainerList>::new(1 << 20, &mut memo);
            let (data, trailers) = through(frames, Some(sink.taker()));
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
            let sink = Sink::<ContainerList>::streamed(1 << 20, &mut memo);
            let (data, trailers) = through(frames_of(&bytes, &cuts), Some(sink.taker()));
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
            let sink = Sink::<ContainerList>::streamed(1 << 20, &mut memo);
            let (data, _) = through(frames_of(&bytes, &cuts), Some(sink.taker()));
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
        let sink = Sink::<ContainerList>::streamed(1 << 20, &mut memo);
        let (data, _) = through(frames_of(&bytes, &[7, 40]), Some(sink.taker()));
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
        let sink = Sink::<ContainerList>::streamed(big.len() - 6, &mut memo);
        let (data, _) = through(frames_of(&bytes, &[3, 100]), Some(sink.taker()));
        assert_eq!(data, [&[0; 5][..], &big, &last].concat());
        // The sink holds the first message's entries alone: the call's outcome is
        // tonic's verdict on the rest (its limit refuses the second).
        let list = sink.into_outcome(&mut memo).expect("taken").expect("valid");
        assert_eq!(list.len(), 2);
        // Compressed: the same.
        let (zipped, _) = stream(&[2], 1);
        let bytes = [first, zipped.clone(), last.clone()].concat();
        let sink = Sink::<ContainerList>::streamed(1 << 20, &mut memo);
        let (data, _) = through(frames_of(&bytes, &[]), Some(sink.taker()));
        assert_eq!(data, [&[0; 5][..], &zipped, &last].concat());
        let list = sink.into_outcome(&mut memo).expect("taken").expect("valid");
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn a_message_over_the_limit_compressed_or_without_a_sink_goes_through_unchanged() {
        let (bytes, frames) = response(50, 0, 7);
        let mut memo = ListMemo::default();
        // One byte under the message's length.
        let small = Sink::<ContainerList>::new(bytes.len() - 6, &mut memo);
        assert_eq!(through(frames, Some(small.taker())).0, bytes);
        assert!(small.into_outcome(&mut memo).is_none());
        let (bytes, frames) = response(50, 1, 7);
        let sink = Sink::<ContainerList>::new(1 << 20, &mut memo);
        assert_eq!(through(frames, Some(sink.taker())).0, bytes);
        assert!(sink.into_outcome(&mut memo).is_none());
        let (bytes, frames) = response(50, 0, 7);
        assert_eq!(through(frames, None).0, bytes);
    }

    #[test]
    fn a_response_that_ends_inside_its_message_is_an_error() {
        let (_, mut frames) = response(50, 0, 100);
        frames.truncate(3);
        let mut memo = ListMemo::default();
        let sink = Sink::<ContainerList>::new(1 << 20, &mut memo);
        let (data, _) = through(frames, Some(sink.taker()));
        assert_eq!(data, [0; 5]);
        assert!(sink.into_outcome(&mut memo).expect("taken").is_err());
    }

    #[test]
    fn the_memo_goes_back_to_its_owner() {
        let (_, frames) = response(3, 0, 10);
        let mut memo = ListMemo::default();
        let sink = Sink::<ContainerList>::new(1 << 20, &mut memo);
        through(frames, Some(sink.taker()));
        assert!(memo.is_empty(), "lent to the sink");
        sink.into_outcome(&mut memo).expect("taken").expect("valid");
        memo.finish(true);
        assert_eq!(memo.len().1, 3, "three entries: three fingerprints");
    }
    /// The messages tonic would decode of what it got: each gRPC message's bytes.
    fn messages_of(mut data: &[u8]) -> Vec<Bytes> {
        let mut messages = Vec::new();
        while !data.is_empty() {
            let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
            messages.push(Bytes::copy_from_slice(&data[5..5 + len]));
            data = &data[5 + len..];
        }
        messages
    }

    fn ids(list: &ContainerList) -> Vec<String> {
        list.iter().map(|c| c.id.to_string()).collect()
    }

    /// What a call with `sink` reads of `frames`: the sink's list, then what tonic
    /// decoded of the rest.
    fn called(
        sink: Sink<ContainerList>,
        frames: Vec<Frame<Bytes>>,
        memo: &mut ListMemo,
    ) -> Result<ContainerList, crate::RuntimeError> {
        let (data, _) = through(frames, Some(sink.taker()));
        sink.outcome("ListContainers", Ok(messages_of(&data)), memo)
    }

    /// A call's list is what the sink read, and then what tonic decoded of the
    /// messages the sink did not take (compressed ones: here their bytes are plain,
    /// as tonic hands them back decompressed).
    #[test]
    fn the_calls_list_holds_what_the_sink_took_and_what_tonic_decoded() {
        let mut memo = ListMemo::default();
        // Taken whole; not taken (flagged compressed), read from tonic's message.
        for compressed in [0, 1] {
            let (_, frames) = response(3, compressed, 7);
            let sink = Sink::<ContainerList>::new(1 << 20, &mut memo);
            let list = called(sink, frames, &mut memo).expect("read");
            assert_eq!(ids(&list), ["c0", "c1", "c2"], "compressed: {compressed}");
        }
        // A stream whose second message was not taken: it and the later ones follow
        // the first in order.
        let (first, _) = stream(&[2], 0);
        let (zipped, _) = stream(&[1], 1);
        let (last, _) = stream(&[2], 0);
        let bytes = [first, zipped, last].concat();
        let sink = Sink::<ContainerList>::streamed(1 << 20, &mut memo);
        let list = called(sink, frames_of(&bytes, &[9]), &mut memo).expect("read");
        assert_eq!(ids(&list), ["c0", "c1", "c0", "c0", "c1"]);
        // A unary response with a message after the one taken.
        let (one, _) = stream(&[1], 0);
        let bytes = [one.clone(), one].concat();
        let sink = Sink::<ContainerList>::new(1 << 20, &mut memo);
        let err = called(sink, frames_of(&bytes, &[]), &mut memo).expect_err("two messages");
        assert!(err.to_string().contains("more than one message"), "{err}");
        // A failed call fails, and the memo's part is given back all the same.
        memo.finish(true);
        let before = memo.len();
        assert!(before.1 > 0);
        let sink = Sink::<ContainerList>::new(1 << 20, &mut memo);
        let (_, frames) = response(3, 0, 7);
        through(frames, Some(sink.taker()));
        assert_eq!(memo.len().1, 0, "lent to the sink");
        let failed = Err(crate::RuntimeError::Timeout {
            op: "ListContainers",
            timeout: std::time::Duration::from_secs(1),
        });
        assert!(sink.outcome("ListContainers", failed, &mut memo).is_err());
        memo.finish(false);
        assert_eq!(memo.len(), before, "the memo's entries came back");
    }

    /// A call whose message the sink does not take leaves the list kept for the next
    /// read where it was.
    #[test]
    fn the_kept_list_goes_back_when_no_message_is_taken() {
        let mut memo = ListMemo::default();
        let (_, frames) = response(200, 0, 100);
        let sink = Sink::<ContainerList>::new(1 << 20, &mut memo);
        through(frames, Some(sink.taker()));
        let Some(Ok(list)) = sink.into_outcome(&mut memo) else {
            panic!("taken");
        };
        memo.keep(NodeLists::Sunk {
            sandboxes: Default::default(),
            containers: list,
        });
        let kept = memo.heap_bytes();
        assert!(kept > 200 * 20, "{kept}");
        // Compressed: not taken.
        let (_, frames) = response(3, 1, 7);
        let sink = Sink::<ContainerList>::new(1 << 20, &mut memo);
        through(frames, Some(sink.taker()));
        assert!(sink.into_outcome(&mut memo).is_none());
        assert_eq!(memo.heap_bytes(), kept);
    }
}
