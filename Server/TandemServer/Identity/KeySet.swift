import Crypto
import CryptoExtras
import TandemWire

/// The public keys tokens are verified with: a JSON Web Key Set (RFC 7517), as an identity
/// provider publishes it at its `jwks_uri`.
///
/// Keys of type `RSA` (2048 bits or more) verify RS256, `EC` on P-256 ES256, `OKP` Ed25519
/// EdDSA. A key whose `use` is not `sig`, or whose `alg` is another, is not used; nor is a
/// symmetric (`oct`) key: a shared secret is never published, it is given with
/// `--jwt-secret-file`.
public struct KeySet: Sendable {
    struct Key: Sendable {
        var id: String?
        /// The JWS `alg` this key verifies.
        var algorithm: String
        var verifier: Verifier

        enum Verifier: Sendable {
            case rsa(_RSA.Signing.PublicKey)
            case p256(P256.Signing.PublicKey)
            case ed25519(Curve25519.Signing.PublicKey)
        }

        func verifies(_ signature: [UInt8], for input: [UInt8]) -> Bool {
            switch verifier {
            case .rsa(let key):
                let signature = _RSA.Signing.RSASignature(rawRepresentation: signature)
                return key.isValidSignature(signature, for: SHA256.hash(data: input), padding: .insecurePKCS1v1_5)
            case .p256(let key):
                guard let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signature) else {
                    return false
                }
                return key.isValidSignature(signature, for: input)
            case .ed25519(let key):
                return key.isValidSignature(signature, for: input)
            }
        }
    }

    let keys: [Key]
    /// Why keys of the set were left out, for the log: one line each.
    public let skipped: [String]

    public static let empty = KeySet(keys: [], skipped: [])

    init(keys: [Key], skipped: [String]) {
        self.keys = keys
        self.skipped = skipped
    }

    public var count: Int { keys.count }
    public var keyIds: [String] { keys.compactMap(\.id) }

    /// The key a token's `kid` names; without a `kid`, the set's only key.
    func key(id: String?) -> Key? {
        guard let id else { return keys.count == 1 ? keys[0] : nil }
        return keys.first { $0.id == id }
    }

    /// Whether a token's `kid` names no key of this set (a refetch may find it).
    public func lacks(keyId: String?) -> Bool { key(id: keyId) == nil }

    /// Parses a JWKS document (`{"keys": […]}`).
    ///
    /// - Throws: ``AccessError`` when the text is not a key set, or holds no key this server
    ///   can use.
    public init(parsing bytes: some Collection<UInt8>, source: String) throws(AccessError) {
        guard case .object(let root)? = try? Wire.parse(bytes), case .array(let entries)? = root["keys"] else {
            throw AccessError("\(source): not a JSON Web Key Set: expected {\"keys\": [ … ]}")
        }
        var keys: [Key] = []
        var skipped: [String] = []
        for (index, entry) in entries.enumerated() {
            guard case .object(let fields) = entry else {
                skipped.append("\(source): keys[\(index)] is not an object")
                continue
            }
            do throws(AccessError) {
                if let key = try Self.key(fields) { keys.append(key) }
            } catch {
                skipped.append(
                    "\(source): keys[\(index)]\(fields["kid"]?.stringValue.map { " (\($0))" } ?? ""): \(error.message)")
            }
        }
        guard !keys.isEmpty else {
            throw AccessError(
                "\(source): no key this server can use (RSA of 2048 bits or more, EC P-256, Ed25519)"
                    + (skipped.isEmpty ? "" : ": " + skipped.joined(separator: "; ")))
        }
        self.keys = keys
        self.skipped = skipped
    }

    /// One JWK as a key; nil for a key that is not for signatures.
    private static func key(_ fields: JSONObject) throws(AccessError) -> Key? {
        if let use = fields["use"]?.stringValue, use != "sig" { return nil }
        func bytes(_ name: String) throws(AccessError) -> [UInt8] {
            guard let text = fields[name]?.stringValue, let bytes = JWTPayload.base64URLDecoded(text), !bytes.isEmpty
            else {
                throw AccessError("'\(name)' is missing or not base64url")
            }
            return bytes
        }
        let algorithm: String
        let verifier: Key.Verifier
        switch fields["kty"]?.stringValue {
        case "RSA":
            algorithm = "RS256"
            do {
                verifier = .rsa(try _RSA.Signing.PublicKey(n: try bytes("n"), e: try bytes("e")))
            } catch let error as AccessError {
                throw error
            } catch {
                throw AccessError("not an RSA key this server takes (2048 bits or more): \(error)")
            }
        case "EC":
            guard fields["crv"]?.stringValue == "P-256" else { throw AccessError("only the EC curve P-256 is taken") }
            algorithm = "ES256"
            let (x, y) = (try bytes("x"), try bytes("y"))
            guard x.count == 32, y.count == 32, let key = try? P256.Signing.PublicKey(rawRepresentation: x + y) else {
                throw AccessError("not a P-256 public key")
            }
            verifier = .p256(key)
        case "OKP":
            guard fields["crv"]?.stringValue == "Ed25519" else {
                throw AccessError("only the OKP curve Ed25519 is taken")
            }
            algorithm = "EdDSA"
            guard let key = try? Curve25519.Signing.PublicKey(rawRepresentation: try bytes("x")) else {
                throw AccessError("not an Ed25519 public key")
            }
            verifier = .ed25519(key)
        case "oct":
            throw AccessError("a symmetric key is never taken from a key set; give the secret with --jwt-secret-file")
        case let other:
            throw AccessError("key type \(other.map { "'\($0)'" } ?? "missing") is not taken")
        }
        if let stated = fields["alg"]?.stringValue, stated != algorithm {
            throw AccessError("its alg '\(stated)' is not the \(algorithm) its key type verifies here")
        }
        return Key(id: fields["kid"]?.stringValue, algorithm: algorithm, verifier: verifier)
    }
}
