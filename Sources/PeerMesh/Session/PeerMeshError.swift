/// Every error PeerMesh throws. Each case's text names the rule that was broken or what to do.
public enum PeerMeshError: Error, Equatable, Sendable, CustomStringConvertible {
    /// A display name outside 1–63 UTF-8 bytes.
    case invalidDisplayName(String)
    /// A service type that breaks MC's rule.
    case invalidServiceType(String)
    /// Discovery info that breaks the size rules.
    case invalidDiscoveryInfo(String)
    /// An argument the call cannot take (empty data, empty peer list, oversize datagram, bad timeout…).
    case invalidParameter(String)
    /// A listed peer is not connected (a reliable send sent nothing; a datagram went to the connected ones).
    case notConnected(String)
    /// A socket call failed (bind, listen, connect…); the text carries `strerror`.
    case transport(String)
    /// A host name does not exist (a permanent failure: trying again will not help).
    case unresolvable(String)
    /// The discovery daemon is missing or failed; the text says what to do.
    case discovery(String)
    /// An identity file is missing, unreadable, readable by others or damaged; the text names it and what to do.
    case identity(String)
    /// A trust store could not be read or written, or is damaged; the text names it and what to do.
    case trust(String)
    /// The link's outbound queue is full: the peer is not reading. Nothing was queued; try again later.
    case busy(String)
    /// The session was already shut down.
    case sessionClosed
    /// A resource transfer was cancelled, by this side or the peer (the text says which).
    case cancelled(String)
    /// A resource transfer failed: the file could not be read or stored, its hash did not match, or the receiver
    /// refused it. The text says which.
    case resource(String)
    /// A stream's `read` or `write` waited longer than its timeout.
    case timedOut(String)

    public var description: String {
        switch self {
        case .invalidDisplayName(let s), .invalidServiceType(let s), .invalidDiscoveryInfo(let s),
             .invalidParameter(let s), .notConnected(let s), .transport(let s), .discovery(let s),
             .identity(let s), .trust(let s), .busy(let s), .unresolvable(let s), .cancelled(let s), .resource(let s), .timedOut(let s):
            return s
        case .sessionClosed:
            return "the session has been shut down"
        }
    }
}
