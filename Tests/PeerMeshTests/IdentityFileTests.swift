import Foundation
import Testing
import MeshPOSIX
@testable import PeerMesh

private func temporaryDirectory() -> String {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("pm-identity-\(UUID().uuidString)").path
    return dir
}

@Suite("Identity and trust files")
struct IdentityFileTests {
    @Test("A state directory is made 0700, missing parents 0755, and existing parents keep their modes (/tmp stays 1777)")
    func parentsAreNeverTightened() throws {
        let base = temporaryDirectory()
        try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
        chmod(base, 0o1777)
        try PrivateFile.ensureDirectory(base + "/a/b/state")
        func mode(_ p: String) -> mode_t { PrivateFile.mode(p)! & 0o7777 }
        #expect(mode(base) == 0o1777, "an existing parent is left as it was")
        #expect(mode(base + "/a") & 0o077 != 0 && mode(base + "/a/b") & 0o077 != 0, "created parents are not private")
        #expect(mode(base + "/a/b/state") == 0o700)
        // An existing state directory readable by others is tightened; its parent is not.
        chmod(base + "/a/b/state", 0o755)
        try PrivateFile.ensureDirectory(base + "/a/b/state")
        #expect(mode(base + "/a/b/state") == 0o700 && mode(base) == 0o1777)
    }

    @Test func anIdentitySurvivesARestartWithPrivatePermissions() throws {
        let dir = temporaryDirectory() + "/state"
        let path = dir + "/identity.json"
        let (made, created) = try PeerIdentity.loadOrCreate(at: path, displayName: "kitchen")
        #expect(created)
        #expect(PrivateFile.mode(dir) == 0o700 && PrivateFile.mode(path) == 0o600)
        let (again, createdAgain) = try PeerIdentity.loadOrCreate(at: path, displayName: "other name")
        #expect(!createdAgain)
        #expect(again.publicKey == made.publicKey && again.displayName == "kitchen")
        #expect(again.peerID == made.peerID && again.peerID.identity == made.publicKey.identity)
        // The private key really is the same: both derive the same shared secret with a third key.
        let third = Noise.KeyPair.generate()
        #expect(Sodium.x25519(made.keys.secret, third.publicKey)!.bytes == Sodium.x25519(again.keys.secret, third.publicKey)!.bytes)
    }

    @Test func aDamagedIdentityIsAnErrorAndIsNotReplaced() throws {
        let path = temporaryDirectory() + "/identity.json"
        _ = try PeerIdentity.loadOrCreate(at: path, displayName: "kitchen")
        var bytes = try PrivateFile.read(path)
        bytes[bytes.count / 2] ^= 0x55
        try PrivateFile.write(bytes, to: path)
        #expect(throws: PeerMeshError.self) { _ = try PeerIdentity.loadOrCreate(at: path, displayName: "kitchen") }
        do { _ = try PeerIdentity.load(from: path) } catch { #expect(error.description.contains("damaged"), "\(error)") }
        #expect(try PrivateFile.read(path) == bytes, "left exactly as it was")
        // Truncated to nothing, and a key that does not match its public half.
        try PrivateFile.write([], to: path)
        #expect(throws: PeerMeshError.self) { _ = try PeerIdentity.load(from: path) }
    }

    @Test func anIdentityReadableByOthersIsRefused() throws {
        let path = temporaryDirectory() + "/identity.json"
        _ = try PeerIdentity.loadOrCreate(at: path, displayName: "kitchen")
        chmod(path, 0o644)
        do {
            _ = try PeerIdentity.load(from: path)
            Issue.record("loaded a world-readable identity")
        } catch {
            #expect(error.description.contains("chmod 600"), "\(error)")
        }
    }

    @Test("An existing state directory open to others is tightened only if it holds files: /, a home or /var/lib never")
    func onlyADirectoryOfFilesIsTightened() throws {
        let ours = temporaryDirectory(), tree = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: ours); try? FileManager.default.removeItem(atPath: tree) }
        for dir in [ours, tree] {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            chmod(dir, 0o755)
        }
        #expect(FileManager.default.createFile(atPath: ours + "/identity.json", contents: Data("{}".utf8)))
        try PrivateFile.ensureDirectory(ours)
        #expect(PrivateFile.mode(ours) == 0o700, "a directory of files, as PeerMesh's own is, is made private")
        try FileManager.default.createDirectory(atPath: tree + "/someone-elses", withIntermediateDirectories: true)
        #expect(throws: SyscallError.self) { try PrivateFile.ensureDirectory(tree) }
        #expect(PrivateFile.mode(tree) == 0o755, "a tree of directories keeps its mode")
    }

    @Test("A trust store or identity that others can change is not trusted")
    func filesOthersCanChangeAreRefused() throws {
        let dir = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = TrustStore(path: dir + "/paired.json")
        let intruder = try PeerIdentity.generate(displayName: "intruder").publicKey
        try store.add(intruder, name: "intruder")
        #expect(try store.contains(intruder))
        chmod(dir + "/paired.json", 0o666)
        #expect(throws: PeerMeshError.self) { try store.contains(intruder) }
        chmod(dir + "/paired.json", 0o620)
        #expect(throws: PeerMeshError.self) { try store.contains(intruder) }
        chmod(dir + "/paired.json", 0o600)
        #expect(try store.contains(intruder))
        // Owned by another user (not root): refused, whatever its mode.
        let identity = dir + "/identity.json"
        _ = try PeerIdentity.loadOrCreate(at: identity, displayName: "kitchen")
        chown(identity, 65_534, 65_534)
        if geteuid() == 0 {
            #expect(throws: PeerMeshError.self) { try PeerIdentity.load(from: identity) }
            chown(dir + "/paired.json", 65_534, 65_534)
            #expect(throws: PeerMeshError.self) { try store.contains(intruder) }
        }
    }

    @Test func trustStoreAddsRenamesForgetsAndPersists() throws {
        let path = temporaryDirectory() + "/trust.json"
        let store = TrustStore(path: path)
        #expect(try store.list().isEmpty)
        let ka = try PeerIdentity.generate(displayName: "a").publicKey
        let kb = try PeerIdentity.generate(displayName: "b").publicKey
        try store.add(ka, name: "kitchen")
        try store.add(kb, name: "bedroom")
        try store.add(ka, name: "Kitchen 2")
        #expect(try TrustStore(path: path).list().map(\.name) == ["Kitchen 2", "bedroom"])
        #expect(try store.contains(kb) && PrivateFile.mode(path) == 0o600)
        // Entries never seen carry no `lastSeenName`: the file is what a store written before the field existed
        // holds, and it loads.
        let unseen = try String(contentsOfFile: path, encoding: .utf8)
        #expect(!unseen.contains("lastSeenName") && unseen.contains("\"name\""), "\(unseen)")
        #expect(try TrustStore(path: path).list().allSatisfy { $0.lastSeenName == nil })
        try store.touch(kb, name: "bedroom")
        #expect(try store.entry(for: kb)?.lastSeen != nil)
        #expect(try store.entry(for: kb)?.lastSeenName == "bedroom" && store.entry(for: kb)?.callsItself == nil)
        // A paired peer that connects under another peer's name keeps the name it was paired under in the list, and
        // forgetting that name forgets the peer paired under it alone. The name it took names it only when no peer
        // was paired under that name.
        try store.touch(kb, name: "Kitchen 2")
        #expect(try TrustStore(path: path).list().map(\.name) == ["Kitchen 2", "bedroom"])
        #expect(try store.entry(for: kb)?.callsItself == "Kitchen 2")
        #expect(try store.remove(matching: "no such name").isEmpty)
        let entries = try store.list()
        #expect(TrustStore.entries(named: "kitchen 2", in: entries).map(\.publicKey) == [ka])
        #expect(TrustStore.entries(named: "Bedroom", in: entries).map(\.publicKey) == [kb])
        #expect(try store.remove(matching: "KITCHEN 2").map(\.publicKey) == [ka])
        #expect(try store.remove(matching: "kitchen 2").map(\.publicKey) == [kb], "no one is paired as kitchen 2 now: the name it gave")
        try store.add(kb, name: "bedroom")
        #expect(try store.remove(matching: "BEDROOM").map(\.publicKey) == [kb])
        try store.add(ka, name: "Kitchen 2")
        #expect(try store.remove(matching: String(ka.fingerprintString.prefix(9))).map(\.publicKey) == [ka])
        #expect(try store.list().isEmpty)
    }

    @Test("A visit is written down once a minute at most for one name, and never for a key that is not trusted: a peer that reconnects without end costs the disk nothing per connection")
    func touchWritesOnlyWhatChanged() throws {
        let path = temporaryDirectory() + "/trust.json"
        let store = TrustStore(path: path)
        let key = try PeerIdentity.generate(displayName: "k").publicKey
        let stranger = try PeerIdentity.generate(displayName: "s").publicKey
        try store.add(key, name: "kitchen")
        // The store is replaced (a new file renamed into place) at every write: its inode tells whether one happened.
        func inode() throws -> Int { try #require(try FileManager.default.attributesOfItem(atPath: path)[.systemFileNumber] as? Int) }
        let t0 = Date(timeIntervalSince1970: 1_800_000_000)
        var written = try inode()
        #expect(try store.touch(stranger, name: "x", at: t0) == nil)
        #expect(try inode() == written, "a key that is not trusted writes nothing")
        #expect(try store.touch(key, name: "kitchen", at: t0)?.lastSeen == t0)
        #expect(try inode() != written, "the first visit is written")
        written = try inode()
        for s in stride(from: 1.0, to: 60, by: 1) {
            #expect(try store.touch(key, name: "kitchen", at: t0 + s)?.name == "kitchen")
        }
        #expect(try inode() == written, "59 visits within the minute: not written again")
        #expect(try store.entry(for: key)?.lastSeen == t0)
        #expect(try store.touch(key, name: "den", at: t0 + 59.5)?.lastSeenName == "den")
        #expect(try inode() != written, "another name is written at once")
        written = try inode()
        #expect(try store.touch(key, name: "den", at: t0 + 70)?.lastSeenName == "den", "the same name again: not written")
        #expect(try inode() == written)
        #expect(try store.touch(key, name: "den", at: t0 + 120)?.lastSeen == t0 + 120)
        #expect(try inode() != written, "a minute later, the visit is written")
        #expect(try TrustStore(path: path).entry(for: key)?.lastSeen == t0 + 120)
    }

    @Test("A name another key is trusted under gets a suffix, so a name picks one peer; pairing a key again keeps or frees its own name")
    func trustedNamesStayUnique() throws {
        let store = TrustStore(path: temporaryDirectory() + "/trust.json")
        let keys = try (0..<4).map { try PeerIdentity.generate(displayName: "k\($0)").publicKey }
        #expect(try store.add(keys[0], name: "raspberrypi").name == "raspberrypi")
        #expect(try store.add(keys[1], name: "RaspberryPi").name == "RaspberryPi-2", "case-insensitive")
        #expect(try store.add(keys[2], name: "raspberrypi").name == "raspberrypi-3")
        #expect(try store.add(keys[0], name: "raspberrypi").name == "raspberrypi", "its own name is not taken from it")
        #expect(try store.add(keys[3], name: "raspberrypi-2").name == "raspberrypi-2-2")
        #expect(try store.list().map(\.name) == ["raspberrypi", "RaspberryPi-2", "raspberrypi-3", "raspberrypi-2-2"])
        let again = try store.add(keys[1], name: "den")
        #expect(again.name == "den" && again.publicKey == keys[1])
        #expect(try store.add(keys[3], name: "raspberrypi-2").name == "raspberrypi-2", "a freed name is free")
        // Every one of them says "raspberrypi" when it connects: a name still picks the one paired under it.
        for k in keys { try store.touch(k, name: "raspberrypi") }
        #expect(try store.remove(matching: "raspberrypi").map(\.publicKey) == [keys[0]], "one name, one peer")
        #expect(try store.list().map(\.name) == ["den", "raspberrypi-3", "raspberrypi-2"])
        // A name as long as a display name may be keeps its suffix within a display name's length.
        let long = String(repeating: "é", count: 31) + "x"  // 63 bytes
        #expect(try store.add(keys[0], name: long).name == long)
        let second = try store.add(try PeerIdentity.generate(displayName: "l").publicKey, name: long).name
        #expect(second == String(repeating: "é", count: 30) + "-2" && second.utf8.count <= PeerID.maximumDisplayNameBytes)
    }

    @Test("A trust store is read again only when its file changed: by this store, or by another process's (a new file renamed in place); one changed within the last 2 s is never taken as unchanged")
    func trustStoreRereadsOnlyAChangedFile() throws {
        let path = temporaryDirectory() + "/paired.json"
        let reader = TrustStore(path: path), writer = TrustStore(path: path)
        let ann = try PeerIdentity.generate(displayName: "ann").publicKey, bob = try PeerIdentity.generate(displayName: "bob").publicKey
        try writer.add(ann, name: "ann")
        let written = Date()
        #expect(try reader.list().map(\.name) == ["ann"])
        #expect(try reader.list().map(\.name) == ["ann"])
        if Date().timeIntervalSince(written) < 1.5 {  // a loaded machine may take longer; the rule is then not tested
            #expect(reader.fileReads.load(ordering: .relaxed) == 2, "just written: read each time")
        }
        Thread.sleep(forTimeInterval: 2.5)
        #expect(try reader.list().map(\.name) == ["ann"])
        let readsBefore = reader.fileReads.load(ordering: .relaxed)
        for _ in 0..<50 { #expect(try reader.contains(ann)) }
        #expect(try reader.list().map(\.name) == ["ann"])
        #expect(reader.fileReads.load(ordering: .relaxed) == readsBefore, "unchanged for 2 s: read once, then from memory")
        // Another store writes: a new file, renamed in place. Seen at once, same size or not.
        try writer.remove(matching: "ann")
        try writer.add(bob, name: "bob")
        #expect(try reader.list().map(\.name) == ["bob"])
        #expect(try !reader.contains(ann) && reader.contains(bob))
        // Opened to others meanwhile: refused at once, cached or not.
        Thread.sleep(forTimeInterval: 2.5)
        _ = try reader.list()
        chmod(path, 0o666)
        #expect(throws: PeerMeshError.self) { _ = try reader.list() }
    }

    @Test func concurrentWritersLoseNothing() throws {
        let path = temporaryDirectory() + "/trust.json"
        let keys = try (0..<64).map { _ in try PeerIdentity.generate(displayName: "x").publicKey }
        DispatchQueue.concurrentPerform(iterations: 8) { worker in
            let store = TrustStore(path: path)   // each writer with its own handle, as separate processes would
            for i in stride(from: worker, to: keys.count, by: 8) { try! store.add(keys[i], name: "peer \(i)") }
        }
        #expect(Set(try TrustStore(path: path).list().map(\.publicKey)) == Set(keys))
    }

    @Test func aDamagedTrustStoreIsAnErrorAndIsNotOverwritten() throws {
        let path = temporaryDirectory() + "/trust.json"
        let store = TrustStore(path: path)
        try store.add(try PeerIdentity.generate(displayName: "a").publicKey, name: "a")
        try PrivateFile.write(Array("{ not json".utf8), to: path)
        #expect(throws: PeerMeshError.self) { try store.list() }
        #expect(throws: PeerMeshError.self) { try store.add(try PeerIdentity.generate(displayName: "b").publicKey, name: "b") }
        #expect(try PrivateFile.read(path) == Array("{ not json".utf8))
    }

    @Test func fingerprintsAndIdentitiesFollowTheKey() throws {
        let k = PublicKey(bytes: Array(repeating: 1, count: 32))!
        #expect(k.fingerprintString.count == 52 + 12)
        #expect(k.shortFingerprint == String(k.fingerprintString.prefix(9)))
        #expect(k.matches(fingerprintPrefix: k.shortFingerprint.uppercased()))
        #expect(!k.matches(fingerprintPrefix: "abc"), "too short to name a key")
        #expect(PublicKey(hex: k.hex) == k && PublicKey(hex: "zz" + k.hex.dropFirst(2)) == nil)
        let p = try PeerID(displayName: "x", publicKey: k)
        #expect(p.identity == k.identity)
        let decoded = try JSONDecoder().decode(PeerID.self, from: JSONEncoder().encode(p))
        #expect(decoded == p && decoded.publicKey == k)
        // A JSON PeerID whose identity does not match its key is refused.
        let forged = #"{"displayName":"x","identity":1,"publicKey":"\#(k.hex)"}"#
        #expect(throws: DecodingError.self) { _ = try JSONDecoder().decode(PeerID.self, from: Data(forged.utf8)) }
    }

    /// The fields of an identity file, to encode the way `save` did before it kept the key from the encoder.
    private struct EncodedIdentity: Codable {
        var format: String
        var displayName: String
        var publicKey: String
        var secretKey: String
    }

    @Test("The identity file's bytes are exactly what the JSON encoder writes for it, with the key spliced in")
    func identityBytesAreTheEncodersOwn() throws {
        // 0xff bytes encode to "/", which the encoder escapes; 0xfb to "+"; the others are random. The last name is
        // not a valid display name (the property is public), longer than the placeholder and made of its character.
        let keys = [[UInt8](repeating: 0xff, count: 32), [UInt8](repeating: 0xfb, count: 32)] + (0..<8).map { _ in Sodium.randomBytes(32) }
        let names = ["kitchen", #"a/b "quoted" \ é"#, String(repeating: "*", count: 63), String(repeating: "*", count: 150)]
        for key in keys {
            for name in names {
                var identity = PeerIdentity(displayName: "x", keys: Noise.KeyPair(secret: SecretKey(copying: key)))
                identity.displayName = name
                let expected = EncodedIdentity(format: "peermesh-identity-1", displayName: name, publicKey: identity.publicKey.hex,
                                               secretKey: Data(key).base64EncodedString())
                #expect(try identity.fileBytes() == Array(try JSONEncoder.pretty.encode(expected)) + [0x0a], "\(name)")
            }
        }
    }

    @Test("Reading a file with a wipe hands it every buffer the bytes pass through, and returns them intact")
    func aSecretFileIsReadThroughWipedBuffers() throws {
        let path = temporaryDirectory() + "/secret"
        try PrivateFile.ensureDirectory(PeerIdentity.directory(of: path))
        let contents = Sodium.randomBytes(40_000)   // three reads of the 16 KiB buffer: the third outgrows the result
        try PrivateFile.write(contents, to: path)
        var wiped: [[UInt8]] = []
        let wipe: (UnsafeMutableRawBufferPointer) -> Void = { buffer in
            wiped.append(Array(buffer))
            buffer.initializeMemory(as: UInt8.self, repeating: 0)
        }
        #expect(try PrivateFile.read(path, limit: 1 << 20, wipingWith: wipe) == contents)
        // The read buffer, holding the last read at its start, and the outgrown result, holding the first two.
        #expect(wiped.contains { $0.count == 16_384 && $0.starts(with: contents[32_768...]) })
        #expect(wiped.contains { $0.count == 32_768 && $0 == Array(contents[..<32_768]) })
        // Too large: the result read so far is dropped, and handed to the wipe too.
        wiped = []
        #expect(throws: SyscallError.self) { _ = try PrivateFile.read(path, limit: 20_000, wipingWith: wipe) }
        #expect(wiped.contains { $0 == Array(contents[..<32_768]) })
    }
}
