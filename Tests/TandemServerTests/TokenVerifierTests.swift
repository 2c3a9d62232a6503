import Crypto
import Foundation
import TandemWire
import Testing

@testable import TandemServer

/// JWT verification without sockets: real signatures made here with swift-crypto, checked
/// against a key set parsed from JWKS text.
@Suite("JWT verification")
struct TokenVerifierTests {
    let issuer = "https://id.example"
    let audience = "tandem"
    let now = Date(timeIntervalSince1970: 1_800_000_000)

    func token(header: String, claims: String, sign: ([UInt8]) throws -> [UInt8]) throws -> String {
        let input =
            JWTPayload.base64URLEncoded(Array(header.utf8)) + "." + JWTPayload.base64URLEncoded(Array(claims.utf8))
        return input + "." + JWTPayload.base64URLEncoded(try sign(Array(input.utf8)))
    }

    func claims(exp: Int = 1_800_000_600, iss: String? = nil, aud: String? = nil, extra: String = "") -> String {
        #"{"sub":"alice","iss":"\#(iss ?? issuer)","aud":"\#(aud ?? audience)","exp":\#(exp)\#(extra)}"#
    }

    @Test(
        "an ES256 token verifies with its key; a changed payload, another key id, none and HS256 without a secret do not"
    )
    func es256() throws {
        let key = P256.Signing.PrivateKey()
        let raw = Array(key.publicKey.rawRepresentation)
        let jwks =
            #"{"keys":[{"kty":"EC","crv":"P-256","kid":"k1","x":"\#(JWTPayload.base64URLEncoded(raw[0..<32]))","y":"\#(JWTPayload.base64URLEncoded(raw[32...]))"}]}"#
        let keys = try KeySet(parsing: Array(jwks.utf8), source: "jwks.json")
        let verifier = TokenVerifier(.init(issuer: issuer, audience: audience))
        let sign: ([UInt8]) throws -> [UInt8] = { Array(try key.signature(for: $0).rawRepresentation) }
        let good = try token(
            header: #"{"alg":"ES256","kid":"k1"}"#, claims: claims(extra: #","role":"admin""#), sign: sign)
        let verified = try verifier.verify(good, keys: keys, now: now)
        #expect(
            verified.user == "alice" && verified.claims["role"] == .string("admin") && verified.expires == 1_800_000_600
        )

        func refusal(_ token: String) -> TokenRefusal? {
            do { _ = try verifier.verify(token, keys: keys, now: now) } catch { return error }
            return nil
        }
        let parts = good.split(separator: ".")
        let forged =
            parts[0] + "."
            + JWTPayload.base64URLEncoded(Array(claims().replacingOccurrences(of: "alice", with: "bob").utf8)) + "."
            + parts[2]
        #expect(refusal(String(forged)) == .badSignature)
        #expect(refusal(try token(header: #"{"alg":"ES256","kid":"k2"}"#, claims: claims(), sign: sign)) == .unknownKey)
        #expect(refusal(try token(header: #"{"alg":"none","kid":"k1"}"#, claims: claims()) { _ in [] }) == .algorithm)
        #expect(refusal(try token(header: #"{"alg":"RS256","kid":"k1"}"#, claims: claims(), sign: sign)) == .algorithm)
        #expect(
            refusal(
                try token(header: #"{"alg":"HS256","kid":"k1"}"#, claims: claims()) {
                    Array(HMAC<SHA256>.authenticationCode(for: $0, using: SymmetricKey(data: raw)))
                }) == .algorithm)
        #expect(
            refusal(try token(header: #"{"alg":"ES256","kid":"k1"}"#, claims: claims(exp: 1_799_999_000), sign: sign))
                == .expired)
        // Within the leeway (60 s) it still holds.
        #expect(
            refusal(try token(header: #"{"alg":"ES256","kid":"k1"}"#, claims: claims(exp: 1_799_999_970), sign: sign))
                == nil)
        #expect(
            refusal(try token(header: #"{"alg":"ES256","kid":"k1"}"#, claims: claims(iss: "https://other"), sign: sign))
                == .wrongIssuer)
        #expect(
            refusal(try token(header: #"{"alg":"ES256","kid":"k1"}"#, claims: claims(aud: "other"), sign: sign))
                == .wrongAudience)
        #expect(refusal("a.b") == .malformed)
        #expect(refusal(String(repeating: "a", count: TokenVerifier.maxTokenBytes + 1)) == .malformed)
    }

    @Test("HS256 verifies only with the secret it was signed with")
    func hs256() throws {
        let secret = Array("0123456789abcdef0123456789abcdef".utf8)
        let verifier = TokenVerifier(.init(issuer: issuer, audience: audience), secret: secret)
        let good = try token(header: #"{"alg":"HS256"}"#, claims: claims()) {
            Array(HMAC<SHA256>.authenticationCode(for: $0, using: SymmetricKey(data: secret)))
        }
        #expect(try verifier.verify(good, keys: .empty, now: now).user == "alice")
        let bad = try token(header: #"{"alg":"HS256"}"#, claims: claims()) {
            Array(HMAC<SHA256>.authenticationCode(for: $0, using: SymmetricKey(data: Array("another".utf8))))
        }
        #expect(throws: TokenRefusal.badSignature) { try verifier.verify(bad, keys: .empty, now: now) }
    }

    @Test("a key set leaves out what it cannot use and says why; an empty one is refused")
    func keySets() throws {
        #expect(throws: AccessError.self) { try KeySet(parsing: Array(#"{"keys":[]}"#.utf8), source: "k") }
        #expect(throws: AccessError.self) {
            try KeySet(parsing: Array(#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#.utf8), source: "k")
        }
        let key = Curve25519.Signing.PrivateKey()
        let x = JWTPayload.base64URLEncoded(Array(key.publicKey.rawRepresentation))
        let set = try KeySet(
            parsing: Array(
                #"{"keys":[{"kty":"oct","k":"c2VjcmV0"},{"kty":"OKP","crv":"Ed25519","x":"\#(x)","kid":"e"}]}"#.utf8),
            source: "k")
        #expect(set.count == 1 && set.skipped.count == 1)
        let verifier = TokenVerifier(.init(issuer: issuer, audience: audience))
        let signed = try token(header: #"{"alg":"EdDSA","kid":"e"}"#, claims: claims()) {
            Array(try key.signature(for: $0))
        }
        #expect(try verifier.verify(signed, keys: set, now: now).user == "alice")
    }

    @Test("rules read the verified token's claims; true and false are values too")
    func claimsInRules() throws {
        let rules =
            #"{"rules":[{"match":"orgs/{org}/notes","read":"token.org == {org} && token.email_verified == true"}]}"#
        let access = try AccessControl(tokens: nil, rules: (rules, "rules.json"))
        let notes = try CollectionPath("orgs/acme/notes")
        func reads(_ token: JSONObject?) throws -> Bool {
            try access.allows(.read, in: notes, identity: Identity(user: "alice", token: token)) { _, _ in nil }
        }
        #expect(try reads(["org": "acme", "email_verified": true]))
        #expect(try !reads(["org": "acme", "email_verified": false]))
        #expect(try !reads(["org": "other", "email_verified": true]))
        #expect(try !reads(nil))
    }
}
