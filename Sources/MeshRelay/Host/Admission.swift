import FoundationEssentials
import PeerMesh

extension RelayHost {
    /// What the host does with an invitation, decided from what it proved: its context, the key its handshake proved
    /// (nil in plaintext), and whether the trust store holds that key. A pure function of the accept policy, so that
    /// every row of the admission table is testable without sockets; `RelayHost` performs the answer.
    enum Admission: Equatable {
        /// A player that comes to pair (`mesh-play --pair`): the pairing window takes it, or it is declined.
        case pairing
        /// Let it in. `byTrust`: its key is in the trust store, so forgetting the key disconnects it.
        case accept(byTrust: Bool)
        /// Ask the operator (`.ask`) about a player whose key is not paired.
        case askOperator
        /// Turn it down, saying why.
        case decline(DeclineReason, String)

        /// The admission table.
        static func decide(context: Data?, key: PublicKey?, trusted: Bool, policy: AcceptPolicy,
                           encryption: EncryptionPreference) -> Admission {
            if context == RelayHost.pairingContext { return .pairing }
            guard key != nil else {
                // No proven key: only a plaintext host that admits all (the bench's baseline) lets it in.
                if case .all = policy, encryption == .none { return .accept(byTrust: false) }
                return .decline(.notTrusted, "an unencrypted player cannot join")
            }
            if trusted { return .accept(byTrust: true) }
            switch policy {
            case .all: return .accept(byTrust: false)
            case .paired: return .decline(.notTrusted, "not paired")
            case .ask: return .askOperator
            }
        }
    }
}
