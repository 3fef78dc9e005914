#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Writes whole lines to a file descriptor in as few `write(2)` calls as it takes, retrying `EINTR`. Used for
/// stderr logs and stdout JSON lines. Not for real-time threads (a terminal can block).
package enum LineWriter {
    /// Writes `text` as is.
    package static func write(_ text: String, to fd: Int32) {
        var t = text
        t.withUTF8 { bytes in
            var offset = 0
            while offset < bytes.count {
                let n = Glibc.write(fd, bytes.baseAddress! + offset, bytes.count - offset)
                if n < 0, errno == EINTR { continue }
                if n <= 0 { return }
                offset += n
            }
        }
    }

    /// Writes `line` and a newline in one call.
    package static func writeLine(_ line: String, to fd: Int32) { write(line + "\n", to: fd) }

    /// Writes `line` and a newline to stderr.
    package static func standardError(_ line: String) { writeLine(line, to: 2) }
}

/// Builds one JSON object, field by field, in the order given — without Foundation.
///
/// Numbers are written plainly; doubles with three significant digits (`12.3`, `0.0451`, `1.23e+05` never:
/// large values are written as rounded integers), non-finite doubles as `null`. Strings are escaped per RFC 8259.
package struct JSONObject: Sendable, CustomStringConvertible {
    private var text = "{"

    package init() {}

    private mutating func key(_ k: String) {
        if text.utf8.count > 1 { text += "," }
        text += JSONObject.quote(k) + ":"
    }

    package mutating func add(_ k: String, _ v: String?) { key(k); text += v.map(JSONObject.quote) ?? "null" }
    package mutating func add(_ k: String, _ v: Bool) { key(k); text += v ? "true" : "false" }
    package mutating func add(_ k: String, _ v: Int) { key(k); text += String(v) }
    package mutating func add(_ k: String, _ v: UInt64) { key(k); text += String(v) }
    package mutating func add(_ k: String, _ v: Double?) { key(k); text += v.map(JSONObject.number) ?? "null" }
    package mutating func add(_ k: String, _ v: [String]) { key(k); text += "[" + v.map(JSONObject.quote).joined(separator: ",") + "]" }
    package mutating func add(_ k: String, _ v: JSONObject) { key(k); text += v.description }
    package mutating func add(_ k: String, _ v: [JSONObject]) { key(k); text += "[" + v.map(\.description).joined(separator: ",") + "]" }
    /// Adds an already-encoded JSON value.
    package mutating func add(_ k: String, raw: String) { key(k); text += raw }

    /// Adds every stored property of `value` under its own name, in declaration order: numbers, booleans and
    /// strings as themselves, nested structs as objects. For statistics structs whose JSON keys are their field
    /// names, so that a counter added to the struct appears in the JSON without a second list to keep in step.
    /// A property of another type is a programming error (trap).
    package mutating func addFields(of value: Any) {
        for child in Mirror(reflecting: value).children {
            guard let name = child.label else { preconditionFailure("addFields(of:) takes a struct, got \(type(of: value))") }
            switch child.value {
            case let v as UInt64: add(name, v)
            case let v as Int: add(name, v)
            case let v as Double: add(name, v)
            case let v as Float: add(name, Double(v))
            case let v as Bool: add(name, v)
            case let v as String: add(name, v)
            default:
                precondition(Mirror(reflecting: child.value).displayStyle == .struct,
                             "addFields(of:): \(name) is a \(type(of: child.value)), which has no JSON form here")
                var nested = JSONObject()
                nested.addFields(of: child.value)
                add(name, nested)
            }
        }
    }

    /// The object, `{…}`.
    package var description: String { text + "}" }

    /// A JSON array of objects, `[…]`.
    package static func array(_ objects: [JSONObject]) -> String { "[" + objects.map(\.description).joined(separator: ",") + "]" }

    /// `s` as a JSON string literal.
    package static func quote(_ s: String) -> String {
        var out = "\""
        for u in s.unicodeScalars {
            switch u {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where u.value < 0x20 || u.value == 0x7f || (0x80..<0xa0).contains(u.value) || u.value == 0x2028 || u.value == 0x2029:
                let hex = String(u.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(u)
            }
        }
        return out + "\""
    }

    /// `v` with three significant digits (integers ≥ 1000 rounded to whole numbers), `null` if not finite.
    package static func number(_ v: Double) -> String {
        guard v.isFinite else { return "null" }
        if v == 0 { return "0" }
        let magnitude = abs(v)
        let exponent = Int(log10(magnitude).rounded(.down))
        let decimals = min(9, max(0, 2 - exponent))
        var scale = 1.0
        for _ in 0..<decimals { scale *= 10 }
        let scaled = (magnitude * scale).rounded()
        guard scaled < 9.0e15 else {
            // Too large for whole digits (a value from a hostile peer can be anything finite): d.dde+N.
            var e = exponent
            var mantissa = (magnitude / pow(10, Double(e)) * 100).rounded()
            if mantissa >= 1000 { mantissa = (mantissa / 10).rounded(); e += 1 }
            let m = Int(mantissa)
            var text = String(m / 100)
            let frac = m % 100
            if frac != 0 { text += "." + (frac < 10 ? "0" : "") + String(frac % 10 == 0 ? frac / 10 : frac) }
            return (v < 0 ? "-" : "") + text + "e+" + String(e)
        }
        let whole = UInt64(scaled)
        var digits = String(whole)
        var out: String
        if decimals == 0 {
            out = digits
        } else {
            if digits.count <= decimals { digits = String(repeating: "0", count: decimals - digits.count + 1) + digits }
            let cut = digits.index(digits.endIndex, offsetBy: -decimals)
            var frac = String(digits[cut...])
            while frac.hasSuffix("0") { frac.removeLast() }
            out = String(digits[..<cut]) + (frac.isEmpty ? "" : "." + frac)
        }
        if out == "0" { return "0" }
        return (v < 0 ? "-" : "") + out
    }
}

extension Unicode.Scalar {
    /// A control character (C0, DEL, C1: the terminal's escape character among them) or an invisible format
    /// character that can reorder or hide what people read (bidirectional controls and marks, the zero-width space,
    /// the soft hyphen, the line and paragraph separators, word joiners, the byte-order mark, interlinear
    /// annotations). Text from the network with one of these must not reach a terminal as it is, nor become a file
    /// name. The zero-width joiner and non-joiner are not among them: emoji sequences (👩‍💻) and the spelling of
    /// Persian, Urdu or Hindi need them, and they neither move nor reorder anything.
    package var isControlOrHidden: Bool {
        switch value {
        case 0x00..<0x20, 0x7f, 0x80..<0xa0, 0xad, 0x061c, 0x200b, 0x200e, 0x200f, 0x2028...0x202e, 0x2060...0x206f,
             0xfeff, 0xfff9...0xfffb: true
        default: false
        }
    }
}
