/// What a client reads of its own JWT: the payload's claims, decoded but not verified. For
/// deciding when to ask for the next token, never for deciding what a token allows (the server
/// verifies).
public enum JWTPayload {
    /// The payload's claims; nil for a token that is not a compact JWS with a JSON payload.
    public static func claims(of token: String) -> JSONObject? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let bytes = base64URLDecoded(parts[1]),
            case .object(let claims)? = try? Wire.parse(bytes, maxDepth: 32)
        else { return nil }
        return claims
    }

    /// The payload's `exp`, in seconds since 1970.
    public static func expiry(of token: String) -> Int64? {
        switch claims(of: token)?["exp"] {
        case .int(let seconds)?: seconds
        case .double(let seconds)? where seconds.isFinite && abs(seconds) < 1e15: Int64(seconds.rounded(.down))
        default: nil
        }
    }

    /// base64url without padding (RFC 7515, section 2); nil for any other text.
    public static func base64URLDecoded(_ text: some StringProtocol) -> [UInt8]? {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count * 3 / 4)
        var buffer: UInt32 = 0
        var bits = 0
        for character in text.utf8 {
            let value: UInt8
            switch character {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): value = character - UInt8(ascii: "A")
            case UInt8(ascii: "a")...UInt8(ascii: "z"): value = character - UInt8(ascii: "a") + 26
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = character - UInt8(ascii: "0") + 52
            case UInt8(ascii: "-"): value = 62
            case UInt8(ascii: "_"): value = 63
            default: return nil
            }
            buffer = buffer << 6 | UInt32(value)
            bits += 6
            if bits >= 8 {
                bits -= 8
                bytes.append(UInt8(truncatingIfNeeded: buffer >> UInt32(bits)))
            }
        }
        // Six bits left over is a length no encoding makes; the bits past the last byte are zero.
        guard bits < 6, buffer & ((1 << UInt32(bits)) - 1) == 0 else { return nil }
        return bytes
    }

    public static func base64URLEncoded(_ bytes: some Sequence<UInt8>) -> String {
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
        var output: [UInt8] = []
        var buffer: UInt32 = 0
        var bits = 0
        for byte in bytes {
            buffer = buffer << 8 | UInt32(byte)
            bits += 8
            while bits >= 6 {
                bits -= 6
                output.append(alphabet[Int(buffer >> UInt32(bits) & 63)])
            }
        }
        if bits > 0 { output.append(alphabet[Int(buffer << UInt32(6 - bits) & 63)]) }
        return String(decoding: output, as: UTF8.self)
    }
}
