import TandemWire

/// An error from Tandem's client library.
///
/// A struct with a ``Code`` you can switch on (new codes do not break your `switch` as long
/// as it has a `default`). When the server refused something, ``serverError`` holds its
/// answer.
///
/// For example:
///
/// ```swift
/// do {
///     try await service.syncNow()
/// } catch let error as TandemError where error.code == .unreachable {
///     showOfflineBadge()
/// }
/// ```
public struct TandemError: Error, Sendable, Hashable, CustomStringConvertible {
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }

        /// The server could not be reached (refused, unknown host, handshake failed).
        public static let unreachable = Code(rawValue: "unreachable")
        /// The connection closed before the answer came.
        public static let disconnected = Code(rawValue: "disconnected")
        /// No answer within the time allowed.
        public static let timedOut = Code(rawValue: "timed-out")
        /// The server answered with an error; see ``TandemError/serverError``.
        public static let server = Code(rawValue: "server")
        /// The arguments were invalid (a bad URL, a record that cannot be encoded).
        public static let invalidArgument = Code(rawValue: "invalid-argument")
        /// The local database failed.
        public static let database = Code(rawValue: "database")
        /// The sync service is not running.
        public static let stopped = Code(rawValue: "stopped")
        /// No token could be had: the app's token provider failed.
        public static let noToken = Code(rawValue: "no-token")

        public var description: String { rawValue }
    }

    public var code: Code
    public var message: String
    /// The server's error, when ``code`` is ``Code/server``.
    public var serverError: WireError?

    public init(_ code: Code, _ message: String, serverError: WireError? = nil) {
        self.code = code
        self.message = message
        self.serverError = serverError
    }

    package init(server error: WireError) {
        self.init(.server, "\(error.code): \(error.message)", serverError: error)
    }

    /// `error` as a `TandemError`, its message after `context` ("cannot connect: …"): a
    /// `TandemError` keeps its code and server error, any other error is `fallback`.
    package init(_ context: String, _ error: any Error, otherwise fallback: Code) {
        if let error = error as? TandemError {
            self.init(error.code, "\(context): \(error.message)", serverError: error.serverError)
        } else {
            self.init(fallback, "\(context): \(error)")
        }
    }

    public var description: String { message }
}
