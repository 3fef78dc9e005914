// The one file that calls OpenSSL's libcrypto: the SHA-256 of a whole resource transfer, through EVP (which uses
// the CPU's SHA extensions where it has them: several times libsodium's portable SHA-256, which is what bounded
// a transfer's speed). Everything else about keys — the Noise handshake's own SHA-256 included — stays in Sodium.
import COpenSSL

/// A libcrypto call that failed, with the library's text (its error queue, drained).
struct OpenSSLError: Error, CustomStringConvertible, Sendable {
    /// The function that failed.
    let call: String
    /// What libcrypto said (empty when it queued nothing).
    let text: String

    var description: String { text.isEmpty ? "\(call) failed" : "\(call) failed: \(text)" }
}

/// Calls into libcrypto. The error funnel: every call's return code goes through `check`, which throws an
/// `OpenSSLError` with the text of libcrypto's error queue.
enum OpenSSL {
    /// Throws unless `rc` is libcrypto's success (1).
    fileprivate static func check(_ rc: Int32, _ call: String) throws(OpenSSLError) {
        guard rc == 1 else { throw failure(call) }
    }

    /// The error for `call`, with every entry of this thread's error queue (which it empties).
    fileprivate static func failure(_ call: String) -> OpenSSLError {
        var texts: [String] = []
        while case let code = ERR_get_error(), code != 0 {
            var buffer = [CChar](repeating: 0, count: 256)
            ERR_error_string_n(code, &buffer, buffer.count)
            texts.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        return OpenSSLError(call: call, text: texts.joined(separator: "; "))
    }

    /// SHA-256 fed in pieces (a resource is hashed chunk by chunk as it is sent or written). Owns its
    /// `EVP_MD_CTX`, freed when released. Not thread-safe: one owner (the loop thread) at a time.
    final class SHA256 {
        /// The digest's size in bytes.
        static let size = 32
        private let context: OpaquePointer
        private var finished = false

        init() throws(OpenSSLError) {
            guard let context = EVP_MD_CTX_new() else { throw OpenSSL.failure("EVP_MD_CTX_new") }
            self.context = context
            // On a throw from here deinit frees the context.
            try OpenSSL.check(EVP_DigestInit_ex(context, EVP_sha256(), nil), "EVP_DigestInit_ex(SHA-256)")
        }

        deinit { EVP_MD_CTX_free(context) }

        func update(_ bytes: UnsafeRawBufferPointer) throws(OpenSSLError) {
            precondition(!finished, "SHA-256 updated after finish")
            guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
            try OpenSSL.check(EVP_DigestUpdate(context, base, bytes.count), "EVP_DigestUpdate")
        }

        func update(_ bytes: [UInt8]) throws(OpenSSLError) {
            precondition(!finished, "SHA-256 updated after finish")
            guard !bytes.isEmpty else { return }
            let rc = bytes.withUnsafeBytes { EVP_DigestUpdate(context, $0.baseAddress, $0.count) }
            try OpenSSL.check(rc, "EVP_DigestUpdate")
        }

        /// The digest (32 bytes). The hasher is spent afterwards.
        func finish() throws(OpenSSLError) -> [UInt8] {
            precondition(!finished, "SHA-256 finished twice")
            finished = true
            var out = [UInt8](repeating: 0, count: Self.size)
            var length: UInt32 = 0
            let rc = out.withUnsafeMutableBufferPointer { EVP_DigestFinal_ex(context, $0.baseAddress, &length) }
            try OpenSSL.check(rc, "EVP_DigestFinal_ex")
            guard length == Self.size else { throw OpenSSLError(call: "EVP_DigestFinal_ex", text: "a digest of \(length) bytes") }
            return out
        }

        /// SHA-256 of the concatenation of `parts` (tests compare it with libsodium's).
        static func digest(_ parts: [[UInt8]]) throws(OpenSSLError) -> [UInt8] {
            let h = try SHA256()
            for p in parts { try h.update(p) }
            return try h.finish()
        }
    }
}
