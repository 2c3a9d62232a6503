/// The closed set of error codes the server sends, as `code` in an `error` message.
///
/// A struct rather than an enum so that a client built against this version keeps working
/// when a later server adds a code: switch over the ones you handle and keep a `default`.
///
/// For example:
///
/// ```swift
/// switch error.code {
/// case .conflict: resolve()
/// case .permissionDenied, .invalidPath: markFailed()
/// default: retryLater()
/// }
/// ```
public struct ErrorCode: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    /// The frame is not a valid message: not JSON, an unknown `type`, a missing or mistyped
    /// field, a binary frame, or a message out of order (anything before `hello`).
    public static let badMessage = ErrorCode(rawValue: "bad-message")
    /// `hello.protocol` is a version this server does not speak.
    public static let unsupportedProtocol = ErrorCode(rawValue: "unsupported-protocol")
    /// The `hello` token is missing or unknown, on a server that requires one.
    public static let unauthenticated = ErrorCode(rawValue: "unauthenticated")
    /// The access rules do not allow this read or write.
    public static let permissionDenied = ErrorCode(rawValue: "permission-denied")
    /// The document does not exist (`update`, `delete`, `get`).
    public static let notFound = ErrorCode(rawValue: "not-found")
    /// A collection path or document id breaks the naming rules.
    public static let invalidPath = ErrorCode(rawValue: "invalid-path")
    /// A document or a write is over a configured limit.
    public static let tooLarge = ErrorCode(rawValue: "too-large")
    /// The connection already has the most listeners it may have.
    public static let tooManyListeners = ErrorCode(rawValue: "too-many-listeners")
    /// A precondition failed; sent as its own `conflict` message with the server's document.
    public static let conflict = ErrorCode(rawValue: "conflict")
    /// The client sends faster than the server accepts; wait and retry.
    public static let rateLimited = ErrorCode(rawValue: "rate-limited")
    /// The server failed; the write did not happen. Retry later.
    public static let `internal` = ErrorCode(rawValue: "internal")
    /// The server lost its database while committing the write and could not find out in time
    /// whether the commit took effect: it may have been applied or not. Resend the same ops
    /// under the same idempotency keys (never new ones): the answer then tells which.
    public static let outcomeUnknown = ErrorCode(rawValue: "outcome-unknown")

    /// Every code of this protocol version.
    public static let all: [ErrorCode] = [
        .badMessage, .unsupportedProtocol, .unauthenticated, .permissionDenied, .notFound, .invalidPath,
        .tooLarge, .tooManyListeners, .conflict, .rateLimited, .internal, .outcomeUnknown,
    ]

    /// True for codes where sending the same thing again cannot succeed: the client should
    /// fail the operation instead of retrying it.
    public var isRejection: Bool {
        [.badMessage, .permissionDenied, .invalidPath, .tooLarge, .unauthenticated, .unsupportedProtocol]
            .contains(self)
    }

    public var description: String { rawValue }
}

/// An error in the protocol: what the server sends as an `error` message, and what decoding
/// and validation throw.
public struct WireError: Error, Sendable, Hashable, CustomStringConvertible {
    public var code: ErrorCode
    /// A sentence saying what was wrong, naming the field (`ops[2].collection`) when there is one.
    public var message: String
    /// The `request` of the message that failed, when it could be read.
    public var request: String?
    /// The `target` of the listen that failed, when it could be read.
    public var target: String?
    /// The index of the write op that failed.
    public var op: Int?

    public init(_ code: ErrorCode, _ message: String, request: String? = nil, target: String? = nil, op: Int? = nil) {
        self.code = code
        self.message = message
        self.request = request
        self.target = target
        self.op = op
    }

    public var description: String { "\(code): \(message)" }
}
