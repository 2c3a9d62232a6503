import Crypto
import CryptoExtras
import Foundation
import TandemWire

/// Why a token was refused. Each reason is counted in `/metrics`
/// (`tandem_tokens_refused_total{reason=…}`) and said, in short, to the client.
public enum TokenRefusal: String, Error, Sendable, CaseIterable {
    /// Not a compact JWS, or its header, payload or signature is not what RFC 7515 and
    /// RFC 7519 say; or longer than ``TokenVerifier/maxTokenBytes``.
    case malformed
    /// `exp` is past (with the leeway).
    case expired
    /// `nbf` is still to come (with the leeway).
    case notYetValid = "not_yet_valid"
    /// The signature does not verify with the key the token names.
    case badSignature = "bad_signature"
    /// No key of the set has the token's `kid` (or the set is empty).
    case unknownKey = "unknown_key"
    /// `alg` is `none`, one this server does not take, or one the key's type does not allow.
    case algorithm
    case wrongIssuer = "wrong_issuer"
    case wrongAudience = "wrong_audience"
    /// The claim that names the user is missing or not a non-empty string.
    case noUser = "no_user"
}

/// A token whose signature and claims were verified.
public struct VerifiedToken: Sendable, Equatable {
    /// The user the token names (its ``TokenVerifier/Configuration/userClaim``).
    public var user: String
    /// Every claim of the payload, as the rules read them (`token.role`).
    public var claims: JSONObject
    /// `exp`, in seconds since 1970; nil when the token has none.
    public var expires: Int64?
}

/// Verifies JSON Web Tokens (RFC 7519) in compact JWS form: the signature against a key set
/// (RS256, ES256, EdDSA) or an HMAC secret (HS256), then `exp`, `nbf`, `iss` and `aud`.
///
/// The key decides the algorithm, never the token alone: a token's `alg` must be the one its
/// key's type signs with (an RSA key verifies RS256 only, so an HS256 token "signed" with an
/// RSA public key as its secret is refused), `none` is refused always, and HS256 only with a
/// secret configured.
public struct TokenVerifier: Sendable {
    /// Tokens longer than this are refused before a byte of them is decoded.
    public static let maxTokenBytes = 16 * 1024

    public struct Configuration: Sendable {
        /// The `iss` a token must carry.
        public var issuer: String
        /// A value the token's `aud` (a string, or an array of strings) must hold.
        public var audience: String
        /// The claim that names the user.
        public var userClaim: String
        /// How far `exp` and `nbf` may be off, for clocks that differ.
        public var leeway: Duration

        public init(issuer: String, audience: String, userClaim: String = "sub", leeway: Duration = .seconds(60)) {
            self.issuer = issuer
            self.audience = audience
            self.userClaim = userClaim
            self.leeway = leeway
        }
    }

    public let configuration: Configuration
    /// The HMAC secret for HS256; nil when HS256 is refused.
    let secret: SymmetricKey?

    public init(_ configuration: Configuration, secret: [UInt8]? = nil) {
        self.configuration = configuration
        self.secret = secret.map { SymmetricKey(data: $0) }
    }

    /// The parts of a compact JWS, decoded but not yet trusted.
    struct Parts {
        var header: JSONObject
        var claims: JSONObject
        /// `header.payload`, as signed.
        var signingInput: Substring.UTF8View
        var signature: [UInt8]

        var algorithm: String? { header["alg"]?.stringValue }
        var keyId: String? { header["kid"]?.stringValue }
    }

    /// Splits and decodes a compact JWS; checks nothing of its signature or claims.
    static func parts(of token: String) throws(TokenRefusal) -> Parts {
        guard token.utf8.count <= maxTokenBytes else { throw .malformed }
        let pieces = token.split(separator: ".", omittingEmptySubsequences: false)
        guard pieces.count == 3, let headerBytes = JWTPayload.base64URLDecoded(pieces[0]),
            let payloadBytes = JWTPayload.base64URLDecoded(pieces[1]),
            let signature = JWTPayload.base64URLDecoded(pieces[2])
        else { throw .malformed }
        guard case .object(let header)? = try? Wire.parse(headerBytes, maxDepth: 8),
            case .object(let claims)? = try? Wire.parse(payloadBytes, maxDepth: 32)
        else { throw .malformed }
        let signed = token[..<pieces[2].startIndex].dropLast()
        return Parts(header: header, claims: claims, signingInput: signed.utf8, signature: signature)
    }

    /// Verifies `token` with `keys` at `now`.
    public func verify(_ token: String, keys: KeySet, now: Date = Date()) throws(TokenRefusal) -> VerifiedToken {
        let parts = try Self.parts(of: token)
        try verifySignature(parts, keys: keys)
        return try checkClaims(parts.claims, now: now)
    }

    func verifySignature(_ parts: Parts, keys: KeySet) throws(TokenRefusal) {
        guard let algorithm = parts.algorithm else { throw .malformed }
        if let critical = parts.header["crit"], critical != .null { throw .malformed }
        let input = Array(parts.signingInput)
        switch algorithm {
        case "HS256":
            guard let secret else { throw .algorithm }
            guard HMAC<SHA256>.isValidAuthenticationCode(parts.signature, authenticating: input, using: secret) else {
                throw .badSignature
            }
        case "RS256", "ES256", "EdDSA":
            guard let key = keys.key(id: parts.keyId) else { throw .unknownKey }
            guard key.algorithm == algorithm else { throw .algorithm }
            guard key.verifies(parts.signature, for: input) else { throw .badSignature }
        default:
            // `none` among them: an unsigned token is never taken.
            throw .algorithm
        }
    }

    func checkClaims(_ claims: JSONObject, now: Date) throws(TokenRefusal) -> VerifiedToken {
        let seconds = now.timeIntervalSince1970
        let leeway = Double(configuration.leeway.components.seconds)
        let expires = try Self.time(claims["exp"])
        if let expires, seconds > Double(expires) + leeway { throw .expired }
        if let notBefore = try Self.time(claims["nbf"]), seconds + leeway < Double(notBefore) { throw .notYetValid }
        guard claims["iss"]?.stringValue == configuration.issuer else { throw .wrongIssuer }
        let audiences: [JSONValue] =
            switch claims["aud"] {
            case .string(let one)?: [.string(one)]
            case .array(let many)?: many
            default: []
            }
        guard audiences.contains(.string(configuration.audience)) else { throw .wrongAudience }
        guard let user = claims[configuration.userClaim]?.stringValue, !user.isEmpty else { throw .noUser }
        return VerifiedToken(user: user, claims: claims, expires: expires)
    }

    /// A NumericDate claim: seconds since 1970, an integer or a fraction.
    private static func time(_ value: JSONValue?) throws(TokenRefusal) -> Int64? {
        switch value {
        case nil, .null?: return nil
        case .int(let seconds)?: return seconds
        case .double(let seconds)? where seconds.isFinite && abs(seconds) < 1e15: return Int64(seconds.rounded(.down))
        default: throw .malformed
        }
    }
}
