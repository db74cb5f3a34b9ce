//! NRI's connection multiplexer: one unix socket (the "trunk") carries two logical
//! ttRPC connections, each frame prefixed by an 8-byte header — the connection id and
//! the payload length, both big-endian u32 (containerd/nri `pkg/net/multiplex`).
//! Connection 1 carries the plugin service (the runtime calls the plugin), connection 2
//! the runtime service (the plugin calls the runtime). Opening a connection sends
//! nothing: both ends simply agree on the ids.
//!
//! Behaviour kept from upstream: frames for an id nobody opened are dropped; a frame
//! longer than one whole ttRPC message (10-byte header + 4 MiB) is a protocol error
//! that closes the trunk; any end of the trunk ends every logical connection. We write
//! frames of at most 4 KiB, so a peer reading through a 4 KiB buffer (Go's `bufio`
//! default under ttrpc) never gets a frame larger than its read.

use std::io;

use tokio::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf,
};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// The logical connection of the plugin service (runtime → plugin calls).
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// The logical connection of the runtime service (plugin → runtime calls).
pub const RUNTIME_SERVICE_CONN: u32 = 2;

const HEADER_LEN: usize = 8;
/// The longest payload a peer may put in one frame: a whole ttRPC message.
pub const MAX_FRAME_PAYLOAD: usize = 10 + (4 << 20);
/// The longest payload we put in one frame.
const WRITE_FRAME_PAYLOAD: usize = 4096;
/// Buffer between the multiplexer and each ttRPC connection.
const LOGICAL_BUFFER: usize = 64 * 1024;

/// Why a multiplexed trunk ended.
#[derive(Debug, thiserror::Error)]
pub enum MuxEnd {
    #[error("the peer closed the connection")]
    PeerClosed,
    #[error("connection error: {0}")]
    Io(#[from] io::Error),
    #[error("protocol error: a frame of {0} bytes is longer than any ttRPC message")]
    OversizedFrame(usize),
    #[error("a local ttRPC connection closed")]
    LocalClosed,
}

/// The two logical connections over one trunk, and the task moving their bytes.
/// Dropping it stops the task and closes the trunk.
#[derive(Debug)]
pub struct Multiplexed {
    /// Connection 1: the plugin service.
    pub plugin_service: DuplexStream,
    /// Connection 2: the runtime service.
    pub runtime_service: DuplexStream,
    /// Ends with the reason the trunk closed.
    pub task: MuxTask,
}

/// The multiplexer's task: await it for the end, drop it to stop.
#[derive(Debug)]
pub struct MuxTask(JoinHandle<MuxEnd>);

impl MuxTask {
    /// Waits until the trunk (and with it both logical connections) ended.
    pub async fn ended(&mut self) -> MuxEnd {
        match (&mut self.0).await {
            Ok(end) => end,
            Err(_) => MuxEnd::LocalClosed,
        }
    }
}

impl Drop for MuxTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Splits `trunk` into the two NRI logical connections. Needs a tokio runtime.
pub fn multiplex<T>(trunk: T) -> Multiplexed
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (plugin_ours, plugin_service) = tokio::io::duplex(LOGICAL_BUFFER);
    let (runtime_ours, runtime_service) = tokio::io::duplex(LOGICAL_BUFFER);
    let task = tokio::spawn(run(trunk, plugin_ours, runtime_ours));
    Multiplexed {
        plugin_service,
        runtime_service,
        task: MuxTask(task),
    }
}

async fn run<T>(trunk: T, plugin: DuplexStream, runtime: DuplexStream) -> MuxEnd
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (trunk_read, trunk_write) = tokio::io::split(trunk);
    let trunk_write = Mutex::new(trunk_write);
    let (plugin_read, plugin_write) = tokio::io::split(plugin);
    let (runtime_read, runtime_write) = tokio::io::split(runtime);
    tokio::select! {
        end = demultiplex(trunk_read, plugin_write, runtime_write) => end,
        end = forward(PLUGIN_SERVICE_CONN, plugin_read, &trunk_write) => end,
        end = forward(RUNTIME_SERVICE_CONN, runtime_read, &trunk_write) => end,
    }
}

/// Reads frames from the trunk and hands each payload to its logical connection.
async fn demultiplex<R: AsyncRead + Unpin>(
    mut trunk: R,
    mut plugin: WriteHalf<DuplexStream>,
    mut runtime: WriteHalf<DuplexStream>,
) -> MuxEnd {
    let mut header = [0u8; HEADER_LEN];
    let mut payload = Vec::new();
    loop {
        if let Err(e) = trunk.read_exact(&mut header).await {
            return end_of(e);
        }
        let (id, len) = parse_header(header);
        if len > MAX_FRAME_PAYLOAD {
            return MuxEnd::OversizedFrame(len);
        }
        payload.resize(len, 0);
        if let Err(e) = trunk.read_exact(&mut payload).await {
            return end_of(e);
        }
        let target = match id {
            PLUGIN_SERVICE_CONN => &mut plugin,
            RUNTIME_SERVICE_CONN => &mut runtime,
            other => {
                tracing::debug!(
                    conn = other,
                    len,
                    "NRI frame for an unknown connection dropped"
                );
                continue;
            }
        };
        if target.write_all(&payload).await.is_err() {
            return MuxEnd::LocalClosed;
        }
    }
}

/// Reads what one logical connection writes and sends it over the trunk in frames.
async fn forward<W: AsyncWrite + Unpin>(
    id: u32,
    mut local: ReadHalf<DuplexStream>,
    trunk: &Mutex<W>,
) -> MuxEnd {
    let mut frame = vec![0u8; HEADER_LEN + WRITE_FRAME_PAYLOAD];
    loop {
        let n = match local.read(&mut frame[HEADER_LEN..]).await {
            Ok(0) | Err(_) => return MuxEnd::LocalClosed,
            Ok(n) => n,
        };
        frame[..HEADER_LEN].copy_from_slice(&encode_header(id, n));
        let mut trunk = trunk.lock().await;
        if let Err(e) = trunk.write_all(&frame[..HEADER_LEN + n]).await {
            return end_of(e);
        }
        if let Err(e) = trunk.flush().await {
            return end_of(e);
        }
    }
}

fn end_of(e: io::Error) -> MuxEnd {
    match e.kind() {
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted => MuxEnd::PeerClosed,
        _ => MuxEnd::Io(e),
    }
}

/// The 8-byte frame header: connection id, payload length (big-endian).
pub fn encode_header(id: u32, len: usize) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header[..4].copy_from_slice(&id.to_be_bytes());
    // A frame we write is at most WRITE_FRAME_PAYLOAD long.
    header[4..].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    header
}

fn parse_header(header: [u8; HEADER_LEN]) -> (u32, usize) {
    let id = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    (id, len as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const WAIT: Duration = Duration::from_secs(10);

    async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> (u32, Vec<u8>) {
        let mut header = [0u8; HEADER_LEN];
        r.read_exact(&mut header).await.unwrap();
        let (id, len) = parse_header(header);
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload).await.unwrap();
        (id, payload)
    }

    #[test]
    fn header_is_big_endian_id_then_length() {
        assert_eq!(encode_header(2, 0x0102), [0, 0, 0, 2, 0, 0, 1, 2]);
        assert_eq!(parse_header([0, 0, 0, 1, 0, 1, 0, 0]), (1, 65536));
    }

    #[tokio::test]
    async fn frames_reach_their_connection_and_unknown_ids_are_dropped() {
        let (trunk, mut peer) = tokio::io::duplex(1 << 20);
        let mut mux = multiplex(trunk);
        peer.write_all(&encode_header(RUNTIME_SERVICE_CONN, 3))
            .await
            .unwrap();
        peer.write_all(b"two").await.unwrap();
        peer.write_all(&encode_header(7, 4)).await.unwrap();
        peer.write_all(b"lost").await.unwrap();
        peer.write_all(&encode_header(PLUGIN_SERVICE_CONN, 3))
            .await
            .unwrap();
        peer.write_all(b"one").await.unwrap();
        let mut buf = [0u8; 3];
        tokio::time::timeout(WAIT, mux.plugin_service.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf, b"one");
        tokio::time::timeout(WAIT, mux.runtime_service.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf, b"two");
    }

    #[tokio::test]
    async fn writes_go_out_in_frames_of_at_most_4_kib_with_their_id() {
        let (trunk, mut peer) = tokio::io::duplex(1 << 20);
        let mut mux = multiplex(trunk);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        mux.runtime_service.write_all(&data).await.unwrap();
        let mut got = Vec::new();
        while got.len() < data.len() {
            let (id, payload) = tokio::time::timeout(WAIT, read_frame(&mut peer))
                .await
                .unwrap();
            assert_eq!(id, RUNTIME_SERVICE_CONN);
            assert!(!payload.is_empty() && payload.len() <= WRITE_FRAME_PAYLOAD);
            got.extend(payload);
        }
        assert_eq!(got, data);
    }

    #[tokio::test]
    async fn a_large_frame_is_accepted_whole() {
        let (trunk, mut peer) = tokio::io::duplex(1 << 20);
        let mut mux = multiplex(trunk);
        let data = vec![7u8; 300_000];
        let writer = tokio::spawn(async move {
            peer.write_all(&encode_header(PLUGIN_SERVICE_CONN, data.len()))
                .await
                .unwrap();
            peer.write_all(&data).await.unwrap();
            peer
        });
        let mut got = vec![0u8; 300_000];
        tokio::time::timeout(WAIT, mux.plugin_service.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert!(got.iter().all(|b| *b == 7));
        drop(writer);
    }

    #[tokio::test]
    async fn an_oversized_frame_closes_the_trunk() {
        let (trunk, mut peer) = tokio::io::duplex(1 << 20);
        let mut mux = multiplex(trunk);
        peer.write_all(&encode_header(PLUGIN_SERVICE_CONN, MAX_FRAME_PAYLOAD + 1))
            .await
            .unwrap();
        let end = tokio::time::timeout(WAIT, mux.task.ended()).await.unwrap();
        assert!(
            matches!(end, MuxEnd::OversizedFrame(n) if n == MAX_FRAME_PAYLOAD + 1),
            "{end:?}"
        );
        // The logical connections see EOF.
        let mut buf = [0u8; 1];
        assert_eq!(mux.plugin_service.read(&mut buf).await.unwrap(), 0);
        // The trunk is closed: the peer reads EOF.
        assert_eq!(peer.read(&mut buf).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn the_peer_closing_ends_both_connections() {
        let (trunk, peer) = tokio::io::duplex(1 << 20);
        let mut mux = multiplex(trunk);
        drop(peer);
        let end = tokio::time::timeout(WAIT, mux.task.ended()).await.unwrap();
        assert!(matches!(end, MuxEnd::PeerClosed), "{end:?}");
        let mut buf = [0u8; 1];
        assert_eq!(mux.plugin_service.read(&mut buf).await.unwrap(), 0);
        assert_eq!(mux.runtime_service.read(&mut buf).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_truncated_frame_is_the_peer_closing() {
        let (trunk, mut peer) = tokio::io::duplex(1 << 20);
        let mut mux = multiplex(trunk);
        peer.write_all(&encode_header(PLUGIN_SERVICE_CONN, 100))
            .await
            .unwrap();
        peer.write_all(b"short").await.unwrap();
        drop(peer);
        let end = tokio::time::timeout(WAIT, mux.task.ended()).await.unwrap();
        assert!(matches!(end, MuxEnd::PeerClosed), "{end:?}");
    }
}
