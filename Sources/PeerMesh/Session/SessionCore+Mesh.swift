import FoundationEssentials
import MeshPOSIX

/// Full-mesh introductions: the driver of `MembershipStateMachine` (loop thread only).
extension SessionCore {
    func performMembership(_ actions: [MembershipStateMachine.Action]) {
        for action in actions {
            switch action {
            case .send(let peer, let frame):
                guard let link = shared.withLock({ $0.machine.primaryLink(for: peer) }),
                      let connection = io.value.connections[link] else { continue }
                connection.send(.mesh(frame))
                switch frame {
                case .introRequest(_, _, let fillsGap):
                    counters.add {
                        $0.introductionsAsked += 1
                        if fillsGap { $0.gapIntroductionsAsked += 1 }
                    }
                case .relink: counters.add { $0.relinksAsked += 1 }
                case .introData, .introduce: break
                }
            case .makeData(let newcomer, let introducer, let introduction):
                guard let link = shared.withLock({ $0.machine.primaryLink(for: introducer) }),
                      let connection = io.value.connections[link], let session = owner.withLock({ $0.value }) else { continue }
                // The address the introducer reaches us at is the one the newcomer most likely can reach too.
                let local = try? connection.socket.localAddress()
                let preferred = local.map { $0.host.hasPrefix("::ffff:") ? String($0.host.dropFirst(7)) : $0.host }
                // The ticket carries the introducer's membership (its tickets are counted as its own) and whom it asked.
                let data = (try? session.nearbyConnectionData(forPeer: newcomer, preferring: preferred,
                                                              introduction: introduction)).map(Array.init) ?? []
                connection.send(.mesh(.introData(forIdentity: newcomer.identity, data: data)))
            case .connect(let peer, let data, let introducer):
                if !connectIntroduced(peer, data: data, introducer: introducer) {
                    io.value.membership.notFollowed(peer, introducedBy: introducer)
                    counters.add { $0.introductionsNotFollowed += 1 }
                }
            case .notFollowed:
                counters.add { $0.introductionsNotFollowed += 1 }
            case .rationed:
                counters.add { $0.introRequestsRationed += 1 }
            case .fault(let peer, let fault):
                guard let link = shared.withLock({ $0.machine.primaryLink(for: peer) }) else { continue }
                faulted(link, fault)
            }
        }
    }
}
