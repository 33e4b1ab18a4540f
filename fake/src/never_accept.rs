//! A listener that never accepts, for connect-timeout tests.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

/// Guard for [`never_accepting_listener`]: keeps the listener and the sockets that fill its
/// accept queue alive. Dropping it frees the port.
pub struct NeverAccept {
    _listener: socket2::Socket,
    _fillers: Vec<socket2::Socket>,
}

/// A loopback listener that never accepts and whose backlog is full, so a TCP connect to it hangs
/// (for connect-timeout tests). Keep the returned guard alive while testing.
///
/// Linux drops SYNs to a listener whose accept queue is full, so the client keeps
/// retransmitting and its connect only fails by timeout. Blocks for up to ~100 ms while probing.
pub fn never_accepting_listener() -> io::Result<(NeverAccept, SocketAddr)> {
    use socket2::{Domain, Protocol, Socket, Type};
    let new_socket = || Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP));
    let listener = new_socket()?;
    listener.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())?;
    listener.listen(0)?;
    let addr = listener
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::other("listener has no inet address"))?;
    let mut fillers = Vec::new();
    // Loopback handshakes complete within the connect call, so a probe that is still pending
    // after 100 ms means the queue is full (backlog 0 usually holds exactly one connection).
    for _ in 0..64 {
        let filler = new_socket()?;
        let probe = filler.connect_timeout(&addr.into(), Duration::from_millis(100));
        fillers.push(filler);
        match probe {
            Ok(()) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
                ) =>
            {
                return Ok((
                    NeverAccept {
                        _listener: listener,
                        _fillers: fillers,
                    },
                    addr,
                ));
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("the accept queue never filled up"))
}
