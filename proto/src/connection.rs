//! Framing: a byte stream carrying length-prefixed `Envelope`s.
//!
//! `Connection` only reads and writes frames; what a message means is the caller's business.

use bytes::{Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use prost::Message as _;
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio_util::codec::{Framed, FramedParts, LengthDelimitedCodec};

use crate::{Envelope, Message};

/// Frames larger than this are refused unless configured otherwise: 4 MiB.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 4 * 1024 * 1024;

/// A fresh read buffer: enough for the small messages most connections carry (heartbeats,
/// updates); the codec reserves room for a larger frame once its length prefix is read.
const READ_BUFFER_BYTES: usize = 512;
/// An idle buffer larger than this is given back (a master holds thousands of mostly idle
/// connections; tokio-util's buffers start at 8 KiB each and never shrink by themselves).
const KEEP_IDLE_BUFFER_BYTES: usize = 16 * 1024;

/// Gives back an empty read buffer that grew past [`KEEP_IDLE_BUFFER_BYTES`].
fn trim_read(buffer: &mut BytesMut) {
    if buffer.is_empty() && buffer.capacity() > KEEP_IDLE_BUFFER_BYTES {
        *buffer = BytesMut::with_capacity(READ_BUFFER_BYTES);
    }
}

/// A written buffer larger than this is given back; a smaller one is kept, so the usual small
/// bursts (acks, updates) do not allocate anew after every flush.
const KEEP_WRITE_BUFFER_BYTES: usize = 4 * 1024;

/// Gives back an empty write buffer's memory once it grew past [`KEEP_WRITE_BUFFER_BYTES`]
/// (tokio-util starts it at 8 KiB); the next message allocates what it needs.
fn trim_write(buffer: &mut BytesMut) {
    if buffer.is_empty() && buffer.capacity() > KEEP_WRITE_BUFFER_BYTES {
        *buffer = BytesMut::new();
    }
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The length prefix announced more than the configured maximum.
    #[error("frame larger than the {limit}-byte limit")]
    FrameTooLarge { limit: usize },
    /// The stream ended in the middle of a frame.
    #[error("connection closed in the middle of a frame")]
    Truncated,
    /// The frame's bytes are not a protobuf `Envelope`.
    #[error("undecodable frame: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A decodable envelope with no message this build knows.
    #[error("frame carries no message this side knows (newer peer?)")]
    UnknownMessage,
    #[error("i/o: {0}")]
    Io(std::io::Error),
}

impl ConnectionError {
    /// True when the peer sent bytes that break the protocol (as opposed to an i/o failure).
    pub fn is_protocol_violation(&self) -> bool {
        !matches!(self, ConnectionError::Io(_))
    }
}

/// A framed, bidirectional protobuf connection over any byte stream (TCP, TLS, in-memory).
pub struct Connection<S> {
    framed: Framed<S, LengthDelimitedCodec>,
    max_frame_bytes: usize,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Connection<S> {
    /// Wraps a stream with the default 4 MiB frame limit.
    pub fn new(stream: S) -> Self {
        Self::with_max_frame(stream, DEFAULT_MAX_FRAME_BYTES)
    }

    /// Wraps a stream refusing frames over `max_frame_bytes`.
    pub fn with_max_frame(stream: S, max_frame_bytes: usize) -> Self {
        let codec = LengthDelimitedCodec::builder()
            .length_field_length(4)
            .big_endian()
            .max_frame_length(max_frame_bytes)
            .new_codec();
        let mut framed = Framed::with_capacity(stream, codec, READ_BUFFER_BYTES);
        trim_write(framed.write_buffer_mut());
        Connection {
            framed,
            max_frame_bytes,
        }
    }

    /// Changes the frame limit from the next frame on: e.g. a small limit while a peer is
    /// unauthenticated, raised once it has registered.
    pub fn set_max_frame(&mut self, max_frame_bytes: usize) {
        self.framed
            .codec_mut()
            .set_max_frame_length(max_frame_bytes);
        self.max_frame_bytes = max_frame_bytes;
    }

    /// Sends one message as one frame.
    pub async fn send(&mut self, message: impl Into<Envelope>) -> Result<(), ConnectionError> {
        let envelope: Envelope = message.into();
        let bytes = Bytes::from(envelope.encode_to_vec());
        self.framed.send(bytes).await.map_err(|e| self.classify(e))
    }

    /// Sends a message without flushing; call [`Connection::flush`] after a batch.
    pub async fn feed(&mut self, message: impl Into<Envelope>) -> Result<(), ConnectionError> {
        let envelope: Envelope = message.into();
        let bytes = Bytes::from(envelope.encode_to_vec());
        self.framed.feed(bytes).await.map_err(|e| self.classify(e))
    }

    /// Flushes messages queued with [`Connection::feed`].
    pub async fn flush(&mut self) -> Result<(), ConnectionError> {
        SinkExt::<Bytes>::flush(&mut self.framed)
            .await
            .map_err(|e| self.classify(e))?;
        trim_write(self.framed.write_buffer_mut());
        Ok(())
    }

    /// Receives the next message; `Ok(None)` when the peer closed cleanly between frames.
    pub async fn recv(&mut self) -> Result<Option<Message>, ConnectionError> {
        let next = self.framed.next().await;
        trim_read(self.framed.read_buffer_mut());
        match next {
            None => Ok(None),
            Some(Err(e)) => Err(self.classify(e)),
            Some(Ok(frame)) => decode_frame(frame),
        }
    }

    /// The underlying stream, e.g. to read the peer address.
    pub fn get_ref(&self) -> &S {
        self.framed.get_ref()
    }

    /// Splits into a receiving and a sending half, so one side can read while the other is
    /// blocked writing to a peer that does not read (bytes already buffered are kept).
    pub fn split(self) -> (ConnectionReader<S>, ConnectionWriter<S>) {
        let parts = self.framed.into_parts();
        let (read_half, write_half) = tokio::io::split(parts.io);
        // One `Framed` per half, each used one way only: `from_parts` keeps the bytes already
        // read (and marks them readable); the unused buffer of each half is given back.
        let mut read = FramedParts::new::<Bytes>(read_half, parts.codec.clone());
        read.read_buf = parts.read_buf;
        let mut stream = Framed::from_parts(read);
        *stream.write_buffer_mut() = BytesMut::new();
        // `from_parts` grows the read buffer to 8 KiB; an empty one starts small again.
        if stream.read_buffer_mut().is_empty() {
            *stream.read_buffer_mut() = BytesMut::with_capacity(READ_BUFFER_BYTES);
        }
        let mut write = FramedParts::new::<Bytes>(write_half, parts.codec);
        write.write_buf = parts.write_buf;
        let mut sink = Framed::from_parts(write);
        *sink.read_buffer_mut() = BytesMut::new();
        trim_write(sink.write_buffer_mut());
        (
            ConnectionReader {
                stream,
                max_frame_bytes: self.max_frame_bytes,
            },
            ConnectionWriter {
                sink,
                max_frame_bytes: self.max_frame_bytes,
            },
        )
    }

    fn classify(&self, e: std::io::Error) -> ConnectionError {
        classify(e, self.max_frame_bytes)
    }
}

fn classify(e: std::io::Error, max_frame_bytes: usize) -> ConnectionError {
    let text = e.to_string();
    if e.kind() == std::io::ErrorKind::InvalidData && text.contains("frame size too big") {
        ConnectionError::FrameTooLarge {
            limit: max_frame_bytes,
        }
    } else if e.kind() == std::io::ErrorKind::UnexpectedEof
        || text.contains("bytes remaining on stream")
    {
        ConnectionError::Truncated
    } else {
        ConnectionError::Io(e)
    }
}

fn decode_frame(frame: bytes::BytesMut) -> Result<Option<Message>, ConnectionError> {
    let envelope = Envelope::decode(frame.freeze())?;
    envelope
        .message
        .map(Some)
        .ok_or(ConnectionError::UnknownMessage)
}

/// The receiving half of a [`Connection::split`].
pub struct ConnectionReader<S> {
    stream: Framed<ReadHalf<S>, LengthDelimitedCodec>,
    max_frame_bytes: usize,
}

impl<S: AsyncRead + AsyncWrite + Unpin> ConnectionReader<S> {
    /// As [`Connection::recv`].
    pub async fn recv(&mut self) -> Result<Option<Message>, ConnectionError> {
        let next = self.stream.next().await;
        trim_read(self.stream.read_buffer_mut());
        match next {
            None => Ok(None),
            Some(Err(e)) => Err(classify(e, self.max_frame_bytes)),
            Some(Ok(frame)) => decode_frame(frame),
        }
    }
}

/// The sending half of a [`Connection::split`].
pub struct ConnectionWriter<S> {
    sink: Framed<WriteHalf<S>, LengthDelimitedCodec>,
    max_frame_bytes: usize,
}

impl<S: AsyncRead + AsyncWrite + Unpin> ConnectionWriter<S> {
    /// As [`Connection::send`].
    pub async fn send(&mut self, message: impl Into<Envelope>) -> Result<(), ConnectionError> {
        let bytes = Bytes::from(message.into().encode_to_vec());
        let limit = self.max_frame_bytes;
        self.sink.send(bytes).await.map_err(|e| classify(e, limit))
    }

    /// As [`Connection::feed`].
    pub async fn feed(&mut self, message: impl Into<Envelope>) -> Result<(), ConnectionError> {
        let bytes = Bytes::from(message.into().encode_to_vec());
        let limit = self.max_frame_bytes;
        self.sink.feed(bytes).await.map_err(|e| classify(e, limit))
    }

    /// As [`Connection::flush`].
    pub async fn flush(&mut self) -> Result<(), ConnectionError> {
        let limit = self.max_frame_bytes;
        SinkExt::<Bytes>::flush(&mut self.sink)
            .await
            .map_err(|e| classify(e, limit))?;
        trim_write(self.sink.write_buffer_mut());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Demand, Ping};
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn round_trips_messages() {
        let (a, b) = tokio::io::duplex(1024);
        let mut a = Connection::new(a);
        let mut b = Connection::new(b);
        a.send(Message::Ping(Ping { nonce: 7 })).await.unwrap();
        a.send(Message::Demand(Demand {
            resources: None,
            count: 3,
        }))
        .await
        .unwrap();
        assert_eq!(
            b.recv().await.unwrap(),
            Some(Message::Ping(Ping { nonce: 7 }))
        );
        assert!(matches!(b.recv().await.unwrap(), Some(Message::Demand(d)) if d.count == 3));
        drop(a);
        assert_eq!(b.recv().await.unwrap(), None);
    }

    #[tokio::test]
    async fn split_halves_keep_buffered_frames_and_work_at_once() {
        let (a, b) = tokio::io::duplex(64);
        let mut a = Connection::new(a);
        let mut b = Connection::new(b);
        a.feed(Message::Ping(Ping { nonce: 1 })).await.unwrap();
        a.feed(Message::Ping(Ping { nonce: 2 })).await.unwrap();
        a.flush().await.unwrap();
        assert_eq!(
            b.recv().await.unwrap(),
            Some(Message::Ping(Ping { nonce: 1 }))
        );
        let (mut reader, mut writer) = b.split();
        // The second frame may already sit in the read buffer: it must not be lost.
        assert_eq!(
            reader.recv().await.unwrap(),
            Some(Message::Ping(Ping { nonce: 2 }))
        );
        // Writing more than the pipe holds while `a` is not reading blocks the writer only.
        let write = async {
            for nonce in 0..100 {
                writer.feed(Message::Ping(Ping { nonce })).await.unwrap();
            }
            writer.flush().await.unwrap();
        };
        let read_and_drain = async {
            a.send(Message::Pong(crate::Pong { nonce: 9 }))
                .await
                .unwrap();
            assert_eq!(
                reader.recv().await.unwrap(),
                Some(Message::Pong(crate::Pong { nonce: 9 }))
            );
            for nonce in 0..100 {
                assert_eq!(a.recv().await.unwrap(), Some(Message::Ping(Ping { nonce })));
            }
        };
        tokio::join!(write, read_and_drain);
    }

    #[tokio::test]
    async fn raised_frame_limit_applies_to_the_next_frame() {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let mut a = Connection::new(a);
        let mut b = Connection::with_max_frame(b, 64);
        let big = Message::Hello(crate::Hello {
            client: "x".repeat(1000),
            ..Default::default()
        });
        a.send(Message::Ping(Ping { nonce: 1 })).await.unwrap();
        assert_eq!(
            b.recv().await.unwrap(),
            Some(Message::Ping(Ping { nonce: 1 }))
        );
        b.set_max_frame(4096);
        a.send(big.clone()).await.unwrap();
        assert_eq!(b.recv().await.unwrap(), Some(big));
    }

    #[tokio::test]
    async fn oversized_frame_is_refused() {
        let (mut a, b) = tokio::io::duplex(1024);
        let mut b = Connection::with_max_frame(b, 16);
        a.write_all(&100u32.to_be_bytes()).await.unwrap();
        a.write_all(&[0u8; 100]).await.unwrap();
        assert!(matches!(
            b.recv().await,
            Err(ConnectionError::FrameTooLarge { limit: 16 })
        ));
    }

    #[tokio::test]
    async fn truncated_frame_is_reported() {
        let (mut a, b) = tokio::io::duplex(1024);
        let mut b = Connection::new(b);
        a.write_all(&10u32.to_be_bytes()).await.unwrap();
        a.write_all(&[1, 2, 3]).await.unwrap();
        drop(a);
        assert!(matches!(b.recv().await, Err(ConnectionError::Truncated)));
    }

    #[tokio::test]
    async fn garbage_is_a_decode_error() {
        let (mut a, b) = tokio::io::duplex(1024);
        let mut b = Connection::new(b);
        a.write_all(&4u32.to_be_bytes()).await.unwrap();
        a.write_all(&[0xff, 0xff, 0xff, 0xff]).await.unwrap();
        assert!(matches!(b.recv().await, Err(ConnectionError::Decode(_))));
    }

    #[tokio::test]
    async fn empty_envelope_is_an_unknown_message() {
        let (mut a, b) = tokio::io::duplex(1024);
        let mut b = Connection::new(b);
        // field 99 (unknown to this build), varint 1
        let unknown = [0x98u8, 0x06, 0x01];
        a.write_all(&(unknown.len() as u32).to_be_bytes())
            .await
            .unwrap();
        a.write_all(&unknown).await.unwrap();
        assert!(matches!(
            b.recv().await,
            Err(ConnectionError::UnknownMessage)
        ));
    }
}
