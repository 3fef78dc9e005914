import FoundationEssentials
import Glibc
import MeshPOSIX
import PeerMesh

/// A CLI's identity and paired devices, from its state directory.
package struct DeviceState: Sendable {
    package let directory: StateDirectory
    package let identity: PeerIdentity
    package let trust: TrustStore

    /// Loads (or, on first run, creates and says so in one line) the identity. `name` (from `--name`) renames it;
    /// without it the saved name stays, and a new identity takes the host name. A damaged or unreadable file is an
    /// error: it ends the run with a line saying what to do, never a silent new identity.
    package static func open(_ directory: StateDirectory, name: String?, terminal: Terminal) -> DeviceState {
        do {
            var (identity, created) = try PeerIdentity.loadOrCreate(at: directory.identityPath,
                                                                    displayName: name ?? RecordOptions.defaultName)
            if created {
                terminal.error("created this device's identity (key \(identity.publicKey.shortFingerprint)) in \(directory.path)")
            } else if let name, identity.displayName != name {
                // Trust follows the key: a new name is only a label.
                identity = try identity.renamed(name)
                try identity.save(to: directory.identityPath)
            }
            let trust = TrustStore(path: directory.trustPath)
            _ = try trust.list()  // a damaged trust store stops the run now, not at the first join
            return DeviceState(directory: directory, identity: identity, trust: trust)
        } catch {
            terminal.fail("\(error)")
        }
    }

    /// Reads the trust store only (for --paired and --forget: no identity is made).
    package static func trustOnly(_ directory: StateDirectory) -> TrustStore { TrustStore(path: directory.trustPath) }

    /// One paired device's line: the name it was paired under, its short fingerprint, when paired, when last seen,
    /// and the name it last gave when that is another (`calls itself "…"`). Names are escaped for the terminal.
    package static func pairedLine(_ p: TrustedPeer) -> String {
        let seen = p.lastSeen.map { StatusReport.timestamp($0) } ?? "never"
        let alias = p.callsItself.map { "\tcalls itself \"\(TerminalText.escape($0))\"" } ?? ""
        return "\(TerminalText.escape(p.name))\t\(p.publicKey.shortFingerprint)\tpaired \(StatusReport.timestamp(p.pairedAt))\tlast seen \(seen)\(alias)"
    }

    /// `--paired`: one line per paired device (`pairedLine`).
    package static func listPaired(_ directory: StateDirectory, what: String, terminal: Terminal, json: Bool) -> Never {
        do {
            let peers = try trustOnly(directory).list()
            if json {
                terminal.stdout(JSONObjectArray.encode(peers))
            } else if peers.isEmpty {
                terminal.error("no paired \(what)s (in \(directory.path))")
            } else {
                for p in peers { terminal.stdout(pairedLine(p)) }
            }
            exit(0)
        } catch {
            terminal.fail("\(error)")
        }
    }

    /// `--forget NAME|FINGERPRINT`.
    package static func forget(_ name: String, _ directory: StateDirectory, what: String, terminal: Terminal) -> Never {
        do {
            let removed = try trustOnly(directory).remove(matching: name)
            guard !removed.isEmpty else { terminal.fail("no paired \(what) is named \"\(TerminalText.escape(name))\"; see --paired") }
            for p in removed { terminal.error("forgot \(TerminalText.escape(p.name)) (\(p.publicKey.shortFingerprint))") }
            exit(0)
        } catch {
            terminal.fail("\(error)")
        }
    }
}

/// JSON for `--paired --json`: per device `name` (the name it was paired under), `fingerprint`, `publicKey`,
/// `pairedAt`, `lastSeen` and `lastSeenName` (the name it gave when it last connected; null: never seen since).
enum JSONObjectArray {
    static func encode(_ peers: [TrustedPeer]) -> String {
        JSONObject.array(peers.map { p in
            var o = JSONObject()
            o.add("name", p.name)
            o.add("fingerprint", p.publicKey.shortFingerprint)
            o.add("publicKey", p.publicKey.hex)
            o.add("pairedAt", StatusReport.timestamp(p.pairedAt))
            o.add("lastSeen", p.lastSeen.map { StatusReport.timestamp($0) })
            o.add("lastSeenName", p.lastSeenName)
            return o
        })
    }
}
