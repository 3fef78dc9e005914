/// Something a remote peer did wrong on the wire.
///
/// A fault is the peer's, never the session's: it closes that peer's connection (or drops its datagram), is
/// counted in `SessionStatistics.peerFaults`, and is named in the delegate's failure detail. The session and its
/// other peers go on.
public enum PeerFault: Error, Equatable, Sendable, CustomStringConvertible {
    /// Bytes on the control connection that do not decode as a frame (the text says how).
    case malformedFrame(String)
    /// A frame that makes no sense in the connection's state (DATA before ACCEPT, a second HELLO…).
    case unexpectedFrame(String)
    /// The peer said nothing (or not enough) before its deadline.
    case silent
    /// Another peer than the one discovered answered at the advertised address (a stale record), or a key other
    /// than the one pinned.
    case wrongPeer
    /// The Noise handshake failed (a message that does not authenticate, a bad key, out of turn).
    case handshake(String)
    /// The peer answered in another mode than the one offered, or offered plaintext to a side that requires
    /// encryption.
    case downgrade
    /// An encrypted record did not authenticate (tampered, replayed, truncated).
    case unauthentic
    /// The peer stopped reading while it kept asking for answers: what was queued to it went past the connection's
    /// limit (`Connection.maximumQueued`, twice what the app may queue), which only unread replies can reach.
    case notReading

    static func malformedFrame(_ e: ControlFrame.DecodeError) -> PeerFault { .malformedFrame(e.description) }

    public var description: String {
        switch self {
        case .malformedFrame(let why): "the peer sent a malformed frame (\(why))"
        case .unexpectedFrame(let what): "the peer sent \(what) out of turn"
        case .silent: "the peer said nothing in time"
        case .wrongPeer: "another peer (another key) answered at that address"
        case .handshake(let why): "the secure handshake failed (\(why))"
        case .downgrade: "the peer tried to connect without the encryption this side requires"
        case .unauthentic: "an encrypted record did not authenticate"
        case .notReading: "the peer stopped reading what it asked for"
        }
    }
}
