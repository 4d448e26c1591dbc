//! A hand-written HTTP/2 client, just enough for one unary gRPC call, for the
//! DRA tests: the kubelet's plugin-watcher client may send a request with no
//! `:authority` at all, which a tonic (or hyper) client cannot, so
//! [`raw_unary`] sends exactly the pseudo-headers it is given.
#![allow(dead_code)] // each test binary uses its own part

use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const FRAME_DATA: u8 = 0;
const FRAME_HEADERS: u8 = 1;
const FRAME_RST_STREAM: u8 = 3;
const FRAME_SETTINGS: u8 = 4;
const FRAME_PING: u8 = 6;
const FRAME_GOAWAY: u8 = 7;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_ACK: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// HPACK integer with a 7-bit prefix (RFC 7541 §5.1), H bit clear.
fn hpack_len(out: &mut Vec<u8>, mut n: usize) {
    if n < 127 {
        out.push(u8::try_from(n).unwrap());
        return;
    }
    out.push(127);
    n -= 127;
    while n >= 128 {
        out.push(u8::try_from(n % 128).unwrap() | 0x80);
        n /= 128;
    }
    out.push(u8::try_from(n).unwrap());
}

/// Literal header fields without indexing, new names, no Huffman (RFC 7541 §6.2.2).
fn hpack(headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        out.push(0x00);
        hpack_len(&mut out, name.len());
        out.extend_from_slice(name.as_bytes());
        hpack_len(&mut out, value.len());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// One unary gRPC call over a fresh connection to `socket`, with exactly these
/// pseudo-headers: `:authority` only when `authority` is `Some`. Returns the
/// response message's bytes, or how the server refused the stream.
pub async fn raw_unary(
    socket: &Path,
    path: &str,
    authority: Option<&str>,
    request: &[u8],
) -> Result<Vec<u8>, String> {
    let mut conn = UnixStream::connect(socket).await.unwrap();
    let mut headers = vec![(":method", "POST"), (":scheme", "http"), (":path", path)];
    if let Some(a) = authority {
        headers.push((":authority", a));
    }
    headers.extend([("content-type", "application/grpc"), ("te", "trailers")]);
    let mut grpc = vec![0u8];
    grpc.extend_from_slice(&u32::try_from(request.len()).unwrap().to_be_bytes());
    grpc.extend_from_slice(request);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(FRAME_SETTINGS, 0, 0, &[]));
    out.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &hpack(&headers)));
    out.extend(frame(FRAME_DATA, FLAG_END_STREAM, 1, &grpc));
    conn.write_all(&out).await.unwrap();

    let mut data = Vec::new();
    let read = async {
        loop {
            let mut head = [0u8; 9];
            conn.read_exact(&mut head)
                .await
                .map_err(|e| format!("connection closed: {e}"))?;
            let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
            let (kind, flags) = (head[3], head[4]);
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let mut payload = vec![0u8; len];
            conn.read_exact(&mut payload)
                .await
                .map_err(|e| e.to_string())?;
            match kind {
                FRAME_SETTINGS if flags & FLAG_ACK == 0 => {
                    conn.write_all(&frame(FRAME_SETTINGS, FLAG_ACK, 0, &[]))
                        .await
                        .unwrap();
                }
                FRAME_PING if flags & FLAG_ACK == 0 => {
                    conn.write_all(&frame(FRAME_PING, FLAG_ACK, 0, &payload))
                        .await
                        .unwrap();
                }
                FRAME_RST_STREAM if stream == 1 => {
                    return Err(format!(
                        "stream reset, error code {}",
                        u32::from_be_bytes(payload[..4].try_into().unwrap())
                    ));
                }
                FRAME_GOAWAY => return Err("connection closed with GOAWAY".to_string()),
                FRAME_DATA if stream == 1 => data.extend_from_slice(&payload),
                _ => {}
            }
            if stream == 1
                && flags & FLAG_END_STREAM != 0
                && (kind == FRAME_DATA || kind == FRAME_HEADERS)
            {
                return Ok(());
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .map_err(|_| "no answer within 10s".to_string())??;
    // One length-prefixed gRPC message; none means the call failed (status in trailers).
    if data.len() < 5 {
        return Err(format!(
            "no response message ({} bytes of DATA)",
            data.len()
        ));
    }
    let len = usize::try_from(u32::from_be_bytes(data[1..5].try_into().unwrap())).unwrap();
    Ok(data[5..5 + len].to_vec())
}

/// The kubelet's `NotifyRegistrationStatus` with `plugin_registered: true`, sent
/// on the registration socket as the plugin watcher sends it (no `:authority`).
pub async fn notify_registered(registration_socket: &Path) -> Result<Vec<u8>, String> {
    use prost::Message;
    use tessera_node::dra::proto::pluginregistration::RegistrationStatus;
    let status = RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    };
    raw_unary(
        registration_socket,
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        None,
        &status.encode_to_vec(),
    )
    .await
}
