import ArgumentParser
import Foundation
import Logging
import TandemServer

extension ServeCommand {
    func validateJWT() throws {
        let verifies = jwks != nil || jwtSecretFile != nil
        guard verifies else {
            for (name, given) in [
                ("--jwt-issuer", jwtIssuer != nil), ("--jwt-audience", jwtAudience != nil),
                ("--jwks-ca", jwksCa != nil),
            ] where given {
                throw ValidationError("\(name) applies to JWTs: give --jwks or --jwt-secret-file with it")
            }
            return
        }
        guard let jwtIssuer, !jwtIssuer.isEmpty, let jwtAudience, !jwtAudience.isEmpty else {
            throw ValidationError(
                "JWT verification needs --jwt-issuer and --jwt-audience: a token is taken only when both match")
        }
        guard !jwtUserClaim.isEmpty else { throw ValidationError("--jwt-user-claim must not be empty") }
        guard (0...3600).contains(jwtLeeway) else {
            throw ValidationError("--jwt-leeway is in seconds, between 0 and 3600, not \(jwtLeeway)")
        }
        if let jwksCa, !FileManager.default.isReadableFile(atPath: jwksCa) {
            throw ValidationError("--jwks-ca: cannot read \(jwksCa)")
        }
    }

    /// The JWT verification the options ask for, its key set read or fetched once now; nil
    /// without --jwks and --jwt-secret-file.
    func jwtAuthentication() throws -> JWTAuthentication? {
        guard jwks != nil || jwtSecretFile != nil, let jwtIssuer, let jwtAudience else { return nil }
        var secret: [UInt8]?
        if let jwtSecretFile {
            do { secret = [UInt8](try Data(contentsOf: URL(fileURLWithPath: jwtSecretFile))) } catch {
                throw CLIError("--jwt-secret-file: cannot read \(jwtSecretFile): \(error.localizedDescription)")
            }
            // A secret written with `echo` ends with a newline that is not part of it.
            while secret?.last == UInt8(ascii: "\n") || secret?.last == UInt8(ascii: "\r") { secret?.removeLast() }
            guard (secret?.count ?? 0) >= 32 else {
                throw CLIError("--jwt-secret-file: an HS256 secret must be at least 32 bytes (RFC 7518, 3.2)")
            }
        }
        let verifier = TokenVerifier(
            .init(
                issuer: jwtIssuer, audience: jwtAudience, userClaim: jwtUserClaim, leeway: .seconds(jwtLeeway)),
            secret: secret)
        var keys: KeySetSource?
        if let jwks {
            do {
                keys = try KeySetSource(
                    KeySetSource.Origin(jwks, authority: jwksCa), logger: Logger(label: "tandem.jwks"))
            } catch {
                throw CLIError("--jwks: \(error.message)")
            }
        }
        return JWTAuthentication(verifier: verifier, keys: keys)
    }
}
