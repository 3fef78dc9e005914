// The one file that calls OpenSSL's libcrypto: the SHA-256 of a whole resource transfer, through EVP (which uses
// the CPU's SHA extensions where it has them: several times libsodium's portable SHA-256, which is what bounded
// a transfer's speed). Everything else about keys — the Noise handshake's own SHA-256 included — stays in Sodium.
//
// libcrypto is loaded when the first resource is hashed (`dlopen`), not at start: a process that never sends or
// receives a resource — mesh-record and mesh-play — does not map it (1.4 MB of resident memory each).
import COpenSSL
import MeshPOSIX

/// A libcrypto call that failed, with the library's text (its error queue, drained).
struct OpenSSLError: Error, CustomStringConvertible, Sendable {
    /// The function that failed.
    let call: String
    /// What libcrypto said (empty when it queued nothing).
    let text: String

    var description: String { text.isEmpty ? "\(call) failed" : "\(call) failed: \(text)" }
}

/// libcrypto's entry points, resolved once, when the first hasher is made.
private struct LibCrypto: Sendable {
    let newContext: pm_EVP_MD_CTX_new_fn
    let freeContext: pm_EVP_MD_CTX_free_fn
    let sha256: pm_EVP_sha256_fn
    let initialize: pm_EVP_DigestInit_ex_fn
    let update: pm_EVP_DigestUpdate_fn
    let finish: pm_EVP_DigestFinal_ex_fn
    let nextError: pm_ERR_get_error_fn
    let errorText: pm_ERR_error_string_n_fn

    /// Loaded on first use (Debian 12 ships libcrypto.so.3; the unversioned name needs its -dev); a failure is kept
    /// and thrown by every hasher.
    static let shared = Result { () throws(SharedLibrary.LoadError) -> LibCrypto in
        let lib = try SharedLibrary.load(["libcrypto.so.3", "libcrypto.so"])
        return LibCrypto(newContext: try lib.function("EVP_MD_CTX_new", as: pm_EVP_MD_CTX_new_fn.self),
                         freeContext: try lib.function("EVP_MD_CTX_free", as: pm_EVP_MD_CTX_free_fn.self),
                         sha256: try lib.function("EVP_sha256", as: pm_EVP_sha256_fn.self),
                         initialize: try lib.function("EVP_DigestInit_ex", as: pm_EVP_DigestInit_ex_fn.self),
                         update: try lib.function("EVP_DigestUpdate", as: pm_EVP_DigestUpdate_fn.self),
                         finish: try lib.function("EVP_DigestFinal_ex", as: pm_EVP_DigestFinal_ex_fn.self),
                         nextError: try lib.function("ERR_get_error", as: pm_ERR_get_error_fn.self),
                         errorText: try lib.function("ERR_error_string_n", as: pm_ERR_error_string_n_fn.self))
    }.mapError { OpenSSLError(call: $0.call, text: $0.text) }
}

/// Calls into libcrypto. The error funnel: every call's return code goes through `check`, which throws an
/// `OpenSSLError` with the text of libcrypto's error queue.
enum OpenSSL {
    /// Throws unless `rc` is libcrypto's success (1).
    fileprivate static func check(_ rc: Int32, _ call: String, _ lib: LibCrypto) throws(OpenSSLError) {
        guard rc == 1 else { throw failure(call, lib) }
    }

    /// The error for `call`, with every entry of this thread's error queue (which it empties).
    fileprivate static func failure(_ call: String, _ lib: LibCrypto) -> OpenSSLError {
        var texts: [String] = []
        while case let code = lib.nextError(), code != 0 {
            var buffer = [CChar](repeating: 0, count: 256)
            lib.errorText(code, &buffer, buffer.count)
            texts.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        return OpenSSLError(call: call, text: texts.joined(separator: "; "))
    }

    /// SHA-256 fed in pieces (a resource is hashed chunk by chunk as it is sent or written). Owns its
    /// `EVP_MD_CTX`, freed when released. Not thread-safe: one owner (the loop thread) at a time.
    final class SHA256 {
        /// The digest's size in bytes.
        static let size = 32
        private let lib: LibCrypto
        private let context: OpaquePointer
        private var finished = false

        init() throws(OpenSSLError) {
            let lib = try LibCrypto.shared.get()
            guard let context = lib.newContext() else { throw OpenSSL.failure("EVP_MD_CTX_new", lib) }
            self.lib = lib
            self.context = context
            // On a throw from here deinit frees the context.
            try OpenSSL.check(lib.initialize(context, lib.sha256(), nil), "EVP_DigestInit_ex(SHA-256)", lib)
        }

        deinit { lib.freeContext(context) }

        func update(_ bytes: UnsafeRawBufferPointer) throws(OpenSSLError) {
            precondition(!finished, "SHA-256 updated after finish")
            guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
            try OpenSSL.check(lib.update(context, base, bytes.count), "EVP_DigestUpdate", lib)
        }

        func update(_ bytes: [UInt8]) throws(OpenSSLError) {
            precondition(!finished, "SHA-256 updated after finish")
            guard !bytes.isEmpty else { return }
            let rc = bytes.withUnsafeBytes { lib.update(context, $0.baseAddress, $0.count) }
            try OpenSSL.check(rc, "EVP_DigestUpdate", lib)
        }

        /// The digest (32 bytes). The hasher is spent afterwards.
        func finish() throws(OpenSSLError) -> [UInt8] {
            precondition(!finished, "SHA-256 finished twice")
            finished = true
            var out = [UInt8](repeating: 0, count: Self.size)
            var length: UInt32 = 0
            let rc = out.withUnsafeMutableBufferPointer { lib.finish(context, $0.baseAddress, &length) }
            try OpenSSL.check(rc, "EVP_DigestFinal_ex", lib)
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
