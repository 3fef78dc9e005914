import FoundationEssentials
import MeshPOSIX
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A peer this device trusts: its key, the name it was paired under, and when; when it last connected, and under
/// which name.
///
/// A peer chooses its own display name, and may change it at every connection. The name it was paired under is
/// what this device calls it, and only pairing again changes it: a paired peer cannot rename its entry. Forgetting
/// by name matches both names, so a peer cannot escape being forgotten under the name it shows either.
public struct TrustedPeer: Codable, Sendable, Equatable {
    /// The key trust is pinned to.
    public var publicKey: PublicKey
    /// The name it was paired under.
    public var name: String
    /// When it was added.
    public var pairedAt: Date
    /// When it last connected, if ever.
    public var lastSeen: Date?
    /// The display name it gave when it last connected, if ever (stores written before this field have none).
    public var lastSeenName: String?

    public init(publicKey: PublicKey, name: String, pairedAt: Date = Date(), lastSeen: Date? = nil,
                lastSeenName: String? = nil) {
        self.publicKey = publicKey
        self.name = name
        self.pairedAt = pairedAt
        self.lastSeen = lastSeen
        self.lastSeenName = lastSeenName
    }

    /// The name it last connected under, when that is not the name it was paired under (nil: the same, or never seen).
    public var callsItself: String? {
        guard let seen = lastSeenName, seen != name else { return nil }
        return seen
    }
}

/// The list of peer keys an app trusts, with names: add, remove, list — persisted in one file.
///
/// Every change is a read-modify-write under an exclusive lock on `PATH.lock`, written atomically (temporary file,
/// `fsync`, `rename`), so concurrent writers in several processes never lose each other's entries and a crash
/// never leaves half a file. A damaged file is an error, never overwritten.
public final class TrustStore: Sendable {
    /// Where the store lives.
    public let path: String

    private struct File: Codable {
        var format: String
        var peers: [TrustedPeer]
    }

    private static let format = "peermesh-trust-1"

    /// The entries as last read, and the version of the file they were read from: a file that has not changed is
    /// not read and decoded again (a host checks its players every 250 ms and each invitation; a player each host it
    /// finds, some of them a flood of strangers).
    private let lastRead = Mutex<(stamp: PrivateFile.Stamp, peers: [TrustedPeer])?>(nil)
    /// How many times the file was read and decoded (tests).
    let fileReads = Atomic<Int>(0)

    /// A store at `path` (created on the first change).
    public init(path: String) {
        self.path = path
    }

    /// Every trusted peer, in the order they were added.
    public func list() throws(PeerMeshError) -> [TrustedPeer] { try read() }

    /// The entry for `key`, if trusted.
    public func entry(for key: PublicKey) throws(PeerMeshError) -> TrustedPeer? { try read().first { $0.publicKey == key } }

    /// Whether `key` is trusted.
    public func contains(_ key: PublicKey) throws(PeerMeshError) -> Bool { try entry(for: key) != nil }

    /// Trusts `key` under `name` (renaming it if already trusted), and returns its entry. Names stay unique: when
    /// another key is trusted under `name` already (case-insensitive), the entry is named `name-2` (or `-3`…) instead,
    /// so that a name picks one peer — two machines left with the same default name are told apart.
    @discardableResult
    public func add(_ key: PublicKey, name: String, at date: Date = Date()) throws(PeerMeshError) -> TrustedPeer {
        var entry = TrustedPeer(publicKey: key, name: name, pairedAt: date)
        try modify { peers in
            entry.name = Self.unique(name, among: peers.lazy.filter { $0.publicKey != key }.map(\.name))
            if let i = peers.firstIndex(where: { $0.publicKey == key }) {
                peers[i].name = entry.name
                entry = peers[i]
            } else {
                peers.append(entry)
            }
            return true
        }
        return entry
    }

    /// `name`, or the first of `name-2`, `name-3`… that none of `taken` is (case-insensitive). A suffixed name stays
    /// within a display name's length (`PeerID.maximumDisplayNameBytes`), so that it can be typed wherever one is
    /// (`--host`): `name` gives up its last characters for the suffix.
    static func unique(_ name: String, among taken: some Sequence<String>) -> String {
        let used = Set(taken.map { $0.lowercased() })
        guard used.contains(name.lowercased()) else { return name }
        var n = 2
        while true {
            let suffix = "-\(n)"
            var base = Substring(name)
            while !base.isEmpty && base.utf8.count + suffix.utf8.count > PeerID.maximumDisplayNameBytes { base.removeLast() }
            let candidate = String(base) + suffix
            if !used.contains(candidate.lowercased()) { return candidate }
            n += 1
        }
    }

    /// How stale `lastSeen` may be: a peer seen again within this many seconds under the name it gave before is not
    /// written down again, so a peer that reconnects as fast as it can costs the disk one write a minute, not two
    /// `fsync`s a connection.
    public static let lastSeenResolution: Double = 60

    /// Notes that `key` connected now, calling itself `name` (kept as `lastSeenName`: the name it was paired under
    /// stays), to the minute (`lastSeenResolution`) while the name stays the same; a new name at once. Returns its
    /// entry as updated (as stored, when nothing was written), or nil when `key` is not trusted (then nothing is
    /// written).
    @discardableResult
    public func touch(_ key: PublicKey, name: String, at date: Date = Date()) throws(PeerMeshError) -> TrustedPeer? {
        var entry: TrustedPeer?
        try modify { peers in
            guard let i = peers.firstIndex(where: { $0.publicKey == key }) else { return false }
            entry = peers[i]
            // A new name is noted at once: what a paired device calls itself is what `--paired` shows of it.
            if peers[i].lastSeenName == name, let seen = peers[i].lastSeen,
               abs(date.timeIntervalSince(seen)) < Self.lastSeenResolution { return false }
            peers[i].lastSeen = date
            peers[i].lastSeenName = name
            entry = peers[i]
            return true
        }
        return entry
    }

    /// Forgets the peers `nameOrFingerprint` names (`entries(named:in:)`). Returns what was removed.
    @discardableResult
    public func remove(matching nameOrFingerprint: String) throws(PeerMeshError) -> [TrustedPeer] {
        var removed: [TrustedPeer] = []
        try modify { peers in
            removed = Self.entries(named: nameOrFingerprint, in: peers)
            let keys = Set(removed.map(\.publicKey))
            peers.removeAll { keys.contains($0.publicKey) }
            return !removed.isEmpty
        }
        return removed
    }

    /// The entries of `peers` that `text` names. A name a device was paired under names that device alone
    /// (case-insensitive): not another whose key's fingerprint happens to start so (a key can be ground to a short
    /// prefix), nor one that calls itself so now. Only when no device was paired under `text` does it name the devices
    /// whose fingerprint starts with it, or that last called themselves so (the name an operator saw them give).
    public static func entries(named text: String, in peers: [TrustedPeer]) -> [TrustedPeer] {
        let paired = entries(pairedUnder: text, in: peers)
        guard paired.isEmpty else { return paired }
        let wanted = text.lowercased()
        return peers.filter { $0.publicKey.matches(fingerprintPrefix: text) || $0.lastSeenName?.lowercased() == wanted }
    }

    /// The entries of `peers` paired under `name` (case-insensitive): one, or none (`add` keeps names unique), or more
    /// in a store written before it did.
    public static func entries(pairedUnder name: String, in peers: [TrustedPeer]) -> [TrustedPeer] {
        let wanted = name.lowercased()
        return peers.filter { $0.name.lowercased() == wanted }
    }

    // MARK: File

    private func read() throws(PeerMeshError) -> [TrustedPeer] {
        guard let before = PrivateFile.stamp(path) else {
            guard PrivateFile.exists(path) else { return [] }
            throw .trust("cannot read the trust store \(path): \(Sys.errorText(errno))")
        }
        // A store someone else can write could name their key as paired: it is not trusted (checked every time).
        if let why = PrivateFile.openToOthers(path) { throw .trust("the trust store \(path) is not trusted: \(why)") }
        if let cached = lastRead.withLock({ $0 }), cached.stamp == before { return cached.peers }
        let peers = try readFile()
        // Kept only if the file did not change while it was read (a write in between: read afresh next time), and
        // only once its times are over 2 s old: two writes within one tick of a coarse clock (a second on some file
        // systems, two on FAT), a freed inode number used again and the same size, would look like one ("racy" stamps).
        if PrivateFile.stamp(path) == before, !before.isRecent(seconds: 2) { lastRead.withLock { $0 = (before, peers) } }
        return peers
    }

    /// Reads and decodes the file.
    private func readFile() throws(PeerMeshError) -> [TrustedPeer] {
        fileReads.add(1, ordering: .relaxed)
        let bytes: [UInt8]
        do { bytes = try PrivateFile.read(path, limit: 8 << 20) } catch {
            throw .trust("cannot read the trust store \(path): \(error.text)")
        }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        guard let file = try? decoder.decode(File.self, from: Data(bytes)), file.format == Self.format else {
            throw .trust("the trust store \(path) is damaged; it was left as it is. Restore it from a backup, or move it away and pair again")
        }
        return file.peers
    }

    /// A read-modify-write under the lock; `change` says whether it changed anything (if not, nothing is written).
    private func modify(_ change: (inout [TrustedPeer]) -> Bool) throws(PeerMeshError) {
        let lock: FileLock
        do {
            try PrivateFile.ensureDirectory(PeerIdentity.directory(of: path))
            lock = try FileLock(path: path + ".lock")
        } catch {
            throw .trust("cannot lock the trust store \(path): \(error.text)")
        }
        defer { lock.unlock() }
        var peers = try read()
        guard change(&peers) else { return }
        let encoder = JSONEncoder.pretty
        encoder.dateEncodingStrategy = .iso8601
        let data: Data
        do { data = try encoder.encode(File(format: Self.format, peers: peers)) } catch {
            throw .trust("cannot encode the trust store: \(error)")
        }
        do { try PrivateFile.write(Array(data) + [0x0a], to: path) } catch {
            throw .trust("cannot write the trust store \(path): \(error.text)")
        }
    }
}
