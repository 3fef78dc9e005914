import FoundationEssentials
import MeshPOSIX

/// A device's long-term identity: its X25519 key pair and display name, as MC's `securityIdentity`.
///
/// Saved to a file only the owner can read (mode 0600, in a 0700 directory), written atomically. A file that is
/// damaged, unreadable or readable by others is a clear error — never silently replaced: replacing it would
/// change who this device is to everyone who trusts it.
public struct PeerIdentity: Sendable {
    /// The name others see (it can change; trust follows the key).
    public var displayName: String
    let keys: Noise.KeyPair

    /// The public key.
    public var publicKey: PublicKey { PublicKey(bytes: keys.publicKey)! }

    /// This identity as a local `PeerID`, for `Session` and the advertiser or browser.
    public var peerID: PeerID {
        // The name was validated when the identity was made or renamed.
        try! PeerID(displayName: displayName, keys: keys)
    }

    /// A new identity with a fresh key pair.
    public static func generate(displayName: String) throws(PeerMeshError) -> PeerIdentity {
        try PeerID.validate(displayName: displayName)
        return PeerIdentity(displayName: displayName, keys: .generate())
    }

    init(displayName: String, keys: Noise.KeyPair) {
        self.displayName = displayName
        self.keys = keys
    }

    /// The same key under another name.
    public func renamed(_ name: String) throws(PeerMeshError) -> PeerIdentity {
        try PeerID.validate(displayName: name)
        return PeerIdentity(displayName: name, keys: keys)
    }

    private struct File: Codable {
        var format: String
        var displayName: String
        var publicKey: String
        var secretKey: String
    }

    private static let format = "peermesh-identity-1"

    /// Writes the identity to `path` (mode 0600, atomically), creating its directory with mode 0700.
    public func save(to path: String) throws(PeerMeshError) {
        var bytes = try fileBytes()
        defer { Sodium.wipe(&bytes) }
        do {
            try PrivateFile.ensureDirectory(Self.directory(of: path))
            try PrivateFile.write(bytes, to: path)
        } catch {
            throw .identity("cannot save the identity to \(path): \(error.text)")
        }
    }

    /// A `File`'s `secretKey` until the key goes in: longer than any display name and not hex, so only the secret
    /// key's field can hold it — and that field sorts last, so the last occurrence is it whatever the name holds.
    private static let secretKeySlot = [UInt8](repeating: UInt8(ascii: "*"), count: 64)

    /// The identity file's bytes: the encoder's pretty-printed JSON, then a newline. They hold the secret key: the
    /// caller wipes them. The encoder never sees the key (its buffers and strings would keep copies nothing wipes):
    /// it encodes `secretKeySlot`, which the key's base64 then replaces, escaped as the encoder escapes it (`/` as
    /// `\/`), so the bytes are the ones it would have written.
    func fileBytes() throws(PeerMeshError) -> [UInt8] {
        let file = File(format: Self.format, displayName: displayName, publicKey: publicKey.hex,
                        secretKey: String(decoding: Self.secretKeySlot, as: UTF8.self))
        let json: [UInt8]
        do { json = Array(try JSONEncoder.pretty.encode(file)) } catch { throw .identity("cannot encode the identity: \(error)") }
        // A plain backward search: the standard `ranges(of:)` would bring in, and instantiate at run time, the
        // string-processing library's generic algorithms (about 250 functions, on pages of their own).
        let width = Self.secretKeySlot.count
        guard let start = stride(from: json.count - width, through: 0, by: -1).first(where: {
            json[$0..<$0 + width].elementsEqual(Self.secretKeySlot)
        }) else { preconditionFailure("the encoder dropped the key's field") }
        let slot = start..<start + width
        var key = Sodium.base64(keys.secret)
        defer { Sodium.wipe(&key) }
        var out: [UInt8] = []
        // Room for every character escaped, so the array never grows (which would leave a copy behind).
        out.reserveCapacity(json.count - slot.count + 2 * key.count + 1)
        out += json[..<slot.lowerBound]
        for c in key {
            if c == UInt8(ascii: "/") { out.append(UInt8(ascii: "\\")) }
            out.append(c)
        }
        out += json[slot.upperBound...]
        out.append(0x0a)
        return out
    }

    /// Reads an identity saved by `save(to:)`.
    /// - Throws: `PeerMeshError.identity` naming the file and what is wrong with it (missing, unreadable, readable
    ///   by others, damaged, or a key that does not match its public half).
    public static func load(from path: String) throws(PeerMeshError) -> PeerIdentity {
        // The file holds the secret key: the buffers it is read through, its bytes and the key decoded from them are
        // wiped (the decoder's own string for the key is beyond reach).
        var bytes: [UInt8]
        do { bytes = try PrivateFile.read(path, limit: 64 << 10, wipingWith: Sodium.wipe) } catch {
            throw .identity("cannot read the identity \(path): \(error.text)")
        }
        defer { Sodium.wipe(&bytes) }
        if let mode = PrivateFile.mode(path), mode & 0o077 != 0 {
            throw .identity("the identity \(path) is readable by others (mode \(String(mode, radix: 8))); run chmod 600 \(path)")
        }
        if let why = PrivateFile.openToOthers(path) { throw .identity("the identity \(path) is not this user's: \(why)") }
        let damaged = "the identity \(path) is damaged; restore it from a backup, or move it away to make a new identity (paired devices must then pair again)"
        // Decoded in place: a `Data` copy of the file would not be wiped.
        let decoded = bytes.withUnsafeMutableBytes { raw in
            raw.baseAddress.flatMap { base in
                try? JSONDecoder().decode(File.self, from: Data(bytesNoCopy: base, count: raw.count, deallocator: .none))
            }
        }
        guard let file = decoded, file.format == format, let claimed = PublicKey(hex: file.publicKey),
              var secret = Data(base64Encoded: file.secretKey)
        else { throw .identity(damaged) }
        defer { secret.withUnsafeMutableBytes { Sodium.wipe($0) } }
        guard secret.count == SecretKey.size else { throw .identity(damaged) }
        let keys = Noise.KeyPair(secret: SecretKey(copying: secret))
        guard keys.publicKey == claimed.bytes else { throw .identity(damaged + " (its keys do not match)") }
        do { try PeerID.validate(displayName: file.displayName) } catch { throw .identity(damaged + " (bad display name)") }
        return PeerIdentity(displayName: file.displayName, keys: keys)
    }

    /// Loads the identity at `path`, or makes and saves a new one when no file is there. Returns whether it was
    /// created. Any other problem with an existing file is thrown, never papered over.
    public static func loadOrCreate(at path: String, displayName: String) throws(PeerMeshError) -> (PeerIdentity, created: Bool) {
        if PrivateFile.exists(path) { return (try load(from: path), false) }
        let identity = try generate(displayName: displayName)
        try identity.save(to: path)
        return (identity, true)
    }

    static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }
}

extension JSONEncoder {
    static var pretty: JSONEncoder {
        let e = JSONEncoder()
        e.outputFormatting = [.prettyPrinted, .sortedKeys]
        return e
    }
}
