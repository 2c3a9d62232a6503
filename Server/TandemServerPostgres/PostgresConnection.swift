import CLibPQ
import Foundation
import Synchronization
import TandemWire

/// One connection to PostgreSQL through libpq, with a deadline on every call.
///
/// libpq's blocking calls wait as long as TCP does: minutes, when the network between a node
/// and the database is cut. Two things bound that wait, for two different failures:
///
/// - **A cut link** is found by TCP itself, in seconds: the connection asks the kernel to
///   give up on data the database's host has not acknowledged within ``linkTimeout``
///   (`tcp_user_timeout`), and to probe an idle connection (keepalives). A database that is
///   merely busy still acknowledges at the TCP level, so load never looks like a partition.
///   (Over a Unix socket there is no link to lose; libpq ignores these settings there.)
/// - **A database that holds the connection but does not answer** (wedged, or far slower than
///   it should be) is found by the deadline: every call uses libpq's asynchronous API
///   (`PQsendQueryParams`, `PQconsumeInput`, `PQisBusy`) and waits with `poll` until
///   `timeout`. A call that runs out of time closes the connection and throws a connection
///   failure, which the caller treats like any lost connection. The deadline is generous on
///   purpose: a statement that is slow because the machine is loaded must finish, not fail.
///
/// Settings given in the URL (`keepalives_idle=…`, `tcp_user_timeout=…`) take precedence over
/// these defaults; settings in a `pg_service.conf` service do not (libpq fills in a service's
/// settings only where none is given), so name them in the URL.
///
/// Statements are prepared once per connection (`PQsendPrepare`) and run by name after.
/// Parameters and results travel as text.
///
/// Not thread-safe: one thread (or serial queue) uses a connection at a time. Package-wide, so
/// that the bench's PostgreSQL floors measure the same client code the store runs.
package final class PostgresConnection {
    package let url: String
    /// How long each call waits for the database (see the type's comment).
    var timeout: Duration
    private var connection: OpaquePointer?
    private var prepared: [String: String] = [:]
    /// The thread using the connection now, and how deep (a cut from inside a query's
    /// `afterSending` is the same use): debug builds check that no other thread comes in.
    private let user = Mutex<(thread: pthread_t, depth: Int)?>(nil)

    /// How long unacknowledged data may wait on a TCP connection before the kernel drops it.
    static let linkTimeout = Duration.seconds(5)

    /// The statement deadline when the server's configuration gives none.
    static let defaultTimeout = Duration.seconds(30)

    /// The most a connection attempt waits, whatever the statement deadline: TCP's
    /// `tcp_user_timeout` does not bound a connect, and a node must retry a database it cannot
    /// reach (and stop, when asked) within seconds, not after a long statement deadline.
    static let maxConnectTimeout = Duration.seconds(10)

    /// Connects within `timeout` (at most ``maxConnectTimeout``).
    ///
    /// - Parameters:
    ///   - url: A libpq connection string or URI, like
    ///     `postgresql://user@/db?host=/run/postgresql&port=5433`.
    ///   - timeout: How long to wait for the connection, and later for each statement's answer.
    /// - Throws: ``PostgresError`` (a connection failure) when the server cannot be reached or
    ///   refuses the connection.
    package init(url: String, timeout: Duration = defaultTimeout) throws(PostgresError) {
        self.url = url
        self.timeout = timeout
        let connectTimeout = min(timeout, Self.maxConnectTimeout)
        let deadline = ContinuousClock.now + connectTimeout
        guard let connection = Self.start(url) else {
            throw PostgresError(connectionFailure: "libpq could not allocate a connection")
        }
        self.connection = connection
        if PQstatus(connection) == CONNECTION_BAD {
            let message = Self.message(connection)
            close()
            throw PostgresError(connectionFailure: "cannot connect to PostgreSQL: \(message)")
        }
        var state = PGRES_POLLING_WRITING
        while state != PGRES_POLLING_OK {
            if state == PGRES_POLLING_FAILED {
                let message = Self.message(connection)
                close()
                throw PostgresError(connectionFailure: "cannot connect to PostgreSQL: \(message)")
            }
            let events = state == PGRES_POLLING_READING ? Int16(POLLIN) : Int16(POLLOUT)
            guard wait(for: events, until: deadline) else {
                close()
                throw PostgresError(connectionFailure: "cannot connect to PostgreSQL within \(connectTimeout)")
            }
            state = PQconnectPoll(connection)
        }
        PQsetnonblocking(connection, 1)
        // libpq prints the server's notices (NOTICE, and the FATAL of a connection the server
        // ends) to standard error by default; the store reports what matters itself.
        PQsetNoticeProcessor(connection, { _, _ in }, nil)
    }

    deinit { close() }

    /// `PQconnectStartParams` with the link settings first and the URL after, expanded in
    /// place (`expand_dbname`): what the URL sets overrides the defaults before it.
    private static func start(_ url: String) -> OpaquePointer? {
        let settings = [
            ("keepalives", "1"),
            ("keepalives_idle", "5"),
            ("keepalives_interval", "1"),
            ("keepalives_count", "3"),
            ("tcp_user_timeout", "\(linkTimeout.milliseconds)"),
            ("dbname", url),
        ]
        let keywords = settings.map { strdup($0.0) }, values = settings.map { strdup($0.1) }
        defer { (keywords + values).forEach { free($0) } }
        let keywordPointers = keywords.map { UnsafePointer($0) } + [nil]
        let valuePointers = values.map { UnsafePointer($0) } + [nil]
        return PQconnectStartParams(keywordPointers, valuePointers, 1)
    }

    /// True until the connection failed or was closed.
    var isOpen: Bool {
        guard let connection else { return false }
        return PQstatus(connection) == CONNECTION_OK
    }

    /// The socket, for waiting on notifications.
    var socket: Int32 { connection.map(PQsocket) ?? -1 }

    func close() {
        enter()
        defer { leave() }
        if let connection { PQfinish(connection) }
        connection = nil
        prepared = [:]
    }

    // MARK: - Statements

    /// Runs one statement with `$1`… parameters (text, or nil for NULL) and returns its rows.
    ///
    /// - Parameter prepare: Prepare the statement once on this connection and run it by name
    ///   after (for statements that run often).
    /// - Throws: ``PostgresError``: the server's error (with its SQLSTATE), or a connection
    ///   failure (the connection is closed then).
    /// - Parameter afterSending: Called once the statement is on its way, before its answer is read
    ///   (tests cut the connection there).
    @discardableResult
    func query(
        _ sql: String, _ parameters: [String?] = [], prepare: Bool = false, afterSending: (() -> Void)? = nil
    ) throws(PostgresError) -> PostgresRows {
        enter()
        defer { leave() }
        guard let connection, PQstatus(connection) == CONNECTION_OK else {
            throw PostgresError(connectionFailure: "the connection to PostgreSQL is closed")
        }
        let deadline = ContinuousClock.now + timeout
        var name: String?
        if prepare {
            if let known = prepared[sql] {
                name = known
            } else {
                let fresh = "tandem_\(prepared.count + 1)"
                let sent = PQsendPrepare(connection, fresh, sql, Int32(parameters.count), nil)
                try finishSending(sent, deadline)
                _ = try results(deadline)
                prepared[sql] = fresh
                name = fresh
            }
        }
        let sent = withParameters(parameters) { values in
            if let name {
                PQsendQueryPrepared(connection, name, Int32(parameters.count), values, nil, nil, 0)
            } else {
                PQsendQueryParams(connection, sql, Int32(parameters.count), nil, values, nil, nil, 0)
            }
        }
        try finishSending(sent, deadline)
        afterSending?()
        return try results(deadline)
    }

    /// Runs statements separated by semicolons in one round trip (libpq's simple query
    /// protocol, `PQsendQuery`), without parameters: `BEGIN; …; COMMIT` as one message.
    ///
    /// - Throws: ``PostgresError``: the first statement's error, or a connection failure.
    package func script(_ sql: String) throws(PostgresError) {
        enter()
        defer { leave() }
        guard let connection, PQstatus(connection) == CONNECTION_OK else {
            throw PostgresError(connectionFailure: "the connection to PostgreSQL is closed")
        }
        let deadline = ContinuousClock.now + timeout
        try finishSending(PQsendQuery(connection, sql), deadline)
        _ = try results(deadline)
    }

    /// Cuts the connection as a network failure would, while libpq still takes it for open:
    /// what was sent before goes out first (TCP sends its FIN after the data), and from now on
    /// libpq's socket number reads end of file and cannot be written, whatever PostgreSQL
    /// answers. (A `shutdown` alone is not enough: an answer already received can still be
    /// read.) For tests.
    func cutForTesting() {
        enter()
        defer { leave() }
        guard let connection else { return }
        var pair: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &pair) == 0 else { return }
        Glibc.close(pair[1])
        // Closes the TCP socket and puts the dead end of the pair in its place.
        dup2(pair[0], PQsocket(connection))
        Glibc.close(pair[0])
    }

    /// Notifications received so far (`LISTEN`), without waiting.
    package func notifications() throws(PostgresError) -> [(channel: String, payload: String)] {
        enter()
        defer { leave() }
        guard let connection, PQconsumeInput(connection) == 1 else {
            let message = connection.map(Self.message) ?? "closed"
            close()
            throw PostgresError(connectionFailure: "the connection to PostgreSQL failed: \(message)")
        }
        var received: [(String, String)] = []
        while let notification = PQnotifies(connection) {
            received.append(
                (String(cString: notification.pointee.relname), String(cString: notification.pointee.extra)))
            PQfreemem(notification)
        }
        return received
    }

    /// Waits until the socket has something to read, at most `duration`.
    package func waitForInput(_ duration: Duration) -> Bool {
        enter()
        defer { leave() }
        return wait(for: Int16(POLLIN), until: ContinuousClock.now + duration)
    }

    // MARK: - Plumbing

    /// Notes a use by this thread; stops a debug build when another thread is using the
    /// connection at the same time.
    private func enter(file: StaticString = #fileID, line: UInt = #line) {
        #if DEBUG
            let me = pthread_self()
            let shared = user.withLock { user -> Bool in
                if let current = user, pthread_equal(current.thread, me) == 0 { return true }
                user = (me, (user?.depth ?? 0) + 1)
                return false
            }
            Confinement.check(!shared, "a PostgreSQL connection used by two threads at once", file: file, line: line)
        #endif
    }

    private func leave() {
        #if DEBUG
            user.withLock { user in
                guard let current = user else { return }
                user = current.depth > 1 ? (current.thread, current.depth - 1) : nil
            }
        #endif
    }

    private func finishSending(_ sent: Int32, _ deadline: ContinuousClock.Instant) throws(PostgresError) {
        guard let connection else { throw PostgresError(connectionFailure: "the connection to PostgreSQL is closed") }
        guard sent == 1 else { throw failure("cannot send to PostgreSQL") }
        while true {
            let flushed = PQflush(connection)
            if flushed == 0 { return }
            if flushed < 0 { throw failure("cannot send to PostgreSQL") }
            guard wait(for: Int16(POLLOUT | POLLIN), until: deadline) else { throw timedOut() }
            if PQconsumeInput(connection) == 0 { throw failure("the connection to PostgreSQL failed") }
        }
    }

    /// Reads every result of the statement sent; throws the first error among them.
    private func results(_ deadline: ContinuousClock.Instant) throws(PostgresError) -> PostgresRows {
        guard let connection else { throw PostgresError(connectionFailure: "the connection to PostgreSQL is closed") }
        var rows = PostgresRows()
        var error: PostgresError?
        while true {
            while PQisBusy(connection) == 1 {
                guard wait(for: Int16(POLLIN), until: deadline) else { throw timedOut() }
                if PQconsumeInput(connection) == 0 { throw failure("the connection to PostgreSQL failed") }
            }
            guard let result = PQgetResult(connection) else { break }
            defer { PQclear(result) }
            switch PQresultStatus(result) {
            case PGRES_TUPLES_OK:
                rows.append(result)
            case PGRES_COMMAND_OK, PGRES_EMPTY_QUERY:
                break
            default:
                if error == nil {
                    let state = PQresultErrorField(result, Int32(UInt8(ascii: "C"))).map { String(cString: $0) }
                    let message = PQresultErrorMessage(result).map { String(cString: $0) } ?? "unknown error"
                    error = PostgresError(
                        state: state ?? "", message: message.trimmingCharacters(in: .whitespacesAndNewlines))
                }
            }
        }
        if PQstatus(connection) != CONNECTION_OK { throw failure("the connection to PostgreSQL failed") }
        if let error { throw error }
        return rows
    }

    private func wait(for events: Int16, until deadline: ContinuousClock.Instant) -> Bool {
        guard let connection else { return false }
        var descriptor = pollfd(fd: PQsocket(connection), events: events, revents: 0)
        while true {
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero else { return false }
            // Rounded up: a wait shorter than a millisecond must not become a busy loop.
            let milliseconds = Int32(min((remaining.milliseconds + 1), 60_000))
            let ready = poll(&descriptor, 1, milliseconds)
            if ready > 0 { return true }
            if ready < 0 && errno != EINTR { return false }
        }
    }

    private func failure(_ what: String) -> PostgresError {
        let message = connection.map(Self.message) ?? "closed"
        close()
        return PostgresError(connectionFailure: "\(what): \(message)")
    }

    private func timedOut() -> PostgresError {
        close()
        return PostgresError(connectionFailure: "PostgreSQL did not answer within \(timeout)")
    }

    private static func message(_ connection: OpaquePointer) -> String {
        PQerrorMessage(connection).map { String(cString: $0) }?.trimmingCharacters(in: .whitespacesAndNewlines)
            ?? "unknown error"
    }

    private func withParameters<T>(
        _ parameters: [String?], _ body: (UnsafePointer<UnsafePointer<CChar>?>?) -> T
    ) -> T {
        var copies = parameters.map { $0.map { strdup($0) } ?? nil }
        defer { for copy in copies { free(copy) } }
        return copies.withUnsafeMutableBufferPointer { buffer in
            buffer.baseAddress!.withMemoryRebound(to: UnsafePointer<CChar>?.self, capacity: max(buffer.count, 1)) {
                body(parameters.isEmpty ? nil : UnsafePointer($0))
            }
        }
    }
}

/// The rows of a statement's results, as text (nil for NULL).
struct PostgresRows {
    private(set) var rows: [[String?]] = []

    mutating func append(_ result: OpaquePointer) {
        let count = PQntuples(result), columns = PQnfields(result)
        rows.reserveCapacity(rows.count + Int(count))
        for row in 0..<count {
            var values: [String?] = []
            values.reserveCapacity(Int(columns))
            for column in 0..<columns {
                if PQgetisnull(result, row, column) == 1 {
                    values.append(nil)
                } else {
                    values.append(String(cString: PQgetvalue(result, row, column)))
                }
            }
            rows.append(values)
        }
    }

    var isEmpty: Bool { rows.isEmpty }
    var count: Int { rows.count }
}

/// An error from PostgreSQL, or a failed connection to it.
package struct PostgresError: Error, CustomStringConvertible {
    /// The SQLSTATE (`23505` for a unique violation); empty for a connection failure.
    var state: String
    var message: String
    /// The connection is gone (refused, lost, timed out); it was closed.
    var isConnectionFailure: Bool

    init(state: String, message: String) {
        self.state = state
        self.message = message
        isConnectionFailure = false
    }

    init(connectionFailure message: String) {
        state = ""
        self.message = message
        isConnectionFailure = true
    }

    package var description: String { state.isEmpty ? message : "\(message) (SQLSTATE \(state))" }

    /// A unique violation or a deadlock: running the transaction again may succeed.
    var isRetryable: Bool { state == "23505" || state == "40P01" || state == "40001" }
}

/// PostgreSQL's text forms of values.
enum PostgresText {
    /// An array literal of texts, `{"a","b\"c",NULL}`.
    ///
    /// Built in UTF-8 bytes: appended a scalar at a time to a `String`, a group's 1,000
    /// documents of 400 bytes took 31 ms, more than PostgreSQL took to store them.
    static func array(_ values: [String?]) -> String {
        let quote = UInt8(ascii: "\""), backslash = UInt8(ascii: "\\")
        var literal: [UInt8] = []
        literal.reserveCapacity(values.reduce(2) { $0 + ($1?.utf8.count ?? 4) + 4 })
        literal.append(UInt8(ascii: "{"))
        for (index, value) in values.enumerated() {
            if index > 0 { literal.append(UInt8(ascii: ",")) }
            guard let value else {
                literal.append(contentsOf: "NULL".utf8)
                continue
            }
            literal.append(quote)
            for byte in value.utf8 {
                if byte == quote || byte == backslash { literal.append(backslash) }
                literal.append(byte)
            }
            literal.append(quote)
        }
        literal.append(UInt8(ascii: "}"))
        return String(decoding: literal, as: UTF8.self)
    }

    static func array(_ values: [Int64]) -> String {
        "{" + values.map(String.init).joined(separator: ",") + "}"
    }

    static func bool(_ value: String?) -> Bool { value == "t" }
    static func int(_ value: String?) -> Int64 { value.flatMap { Int64($0) } ?? 0 }
}
