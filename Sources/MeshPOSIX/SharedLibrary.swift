#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A C library loaded when a feature first needs it (`dlopen`), rather than by the loader at start: a process that
/// never uses the feature does not map the library and what it pulls in. The leaf file that wraps the library takes
/// its entry points (`function`) as the C function types its shim declares (`typedef __typeof__(&f) pm_f_fn;`), so
/// the signatures are the library's own. The handle is never closed: the library stays for the process.
package struct SharedLibrary: @unchecked Sendable {  // an immutable handle to a library that is never unloaded
    /// A library or entry point that could not be had, with the loader's text (`dlerror`).
    package struct LoadError: Error, Equatable, Sendable, CustomStringConvertible {
        /// What failed, e.g. `dlopen(libcrypto.so.3 or libcrypto.so)` or `dlsym(EVP_sha256)`.
        package let call: String
        /// The loader's explanation.
        package let text: String

        package var description: String { "\(call): \(text)" }
    }

    private let handle: UnsafeMutableRawPointer
    /// The name it was loaded by.
    package let name: String

    /// Loads the first of `names` (sonames, most specific first) that the loader finds.
    package static func load(_ names: [String]) throws(LoadError) -> SharedLibrary {
        var why = "not found"
        for name in names {
            if let handle = dlopen(name, RTLD_NOW | RTLD_LOCAL) { return SharedLibrary(handle: handle, name: name) }
            why = dlerror().map { String(cString: $0) } ?? why
        }
        throw LoadError(call: "dlopen(\(names.joined(separator: " or ")))", text: why)
    }

    /// The entry point `symbol` as `T`, a C function pointer type.
    package func function<T>(_ symbol: String, as type: T.Type) throws(LoadError) -> T {
        precondition(MemoryLayout<T>.size == MemoryLayout<UnsafeRawPointer>.size, "\(T.self) is not a C function pointer type")
        guard let pointer = dlsym(handle, symbol) else { throw LoadError(call: "dlsym(\(symbol))", text: "not in \(name)") }
        return unsafeBitCast(pointer, to: T.self)
    }
}
