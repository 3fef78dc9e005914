import MeshPOSIX

/// Makes text from the network safe to print on a terminal: control characters (C0, DEL, C1 — the escape
/// character among them), Unicode bidirectional controls and other invisible format characters become visible
/// escapes (`\x1b`, `\u{202e}`), so a remote name can neither move the cursor, rewrite a prompt, nor reorder what
/// people read. A backslash is doubled, so an escape in the output always means the text held that character.
package enum TerminalText {
    package static func escape(_ s: String) -> String {
        var out = ""
        out.reserveCapacity(s.utf8.count)
        for u in s.unicodeScalars {
            let v = u.value
            switch v {
            case 0x5c: out += "\\\\"
            case _ where u.isControlOrHidden && v < 0xa0:
                let hex = String(v, radix: 16)
                out += "\\x" + (hex.count < 2 ? "0" : "") + hex
            case _ where u.isControlOrHidden, 0x200c, 0x200d:
                // The zero-width joiner and non-joiner too (a file name may hold them): between Latin letters they
                // show nothing, and one name could pass for another.
                out += "\\u{" + String(v, radix: 16) + "}"
            default:
                out.unicodeScalars.append(u)
            }
        }
        return out
    }
}
