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
    /// Another peer than the one discovered answered at the advertised address (a stale record).
    case wrongPeer

    static func malformedFrame(_ e: ControlFrame.DecodeError) -> PeerFault { .malformedFrame(e.description) }

    public var description: String {
        switch self {
        case .malformedFrame(let why): "the peer sent a malformed frame (\(why))"
        case .unexpectedFrame(let what): "the peer sent \(what) out of turn"
        case .silent: "the peer said nothing in time"
        case .wrongPeer: "another peer answered at that address"
        }
    }
}
