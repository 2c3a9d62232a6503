import Foundation
import Synchronization

/// A test host of its own: a Linux network namespace joined to this one by two links (veth
/// pairs), one for clients and one for the database, so that a test can cut the host off from
/// the database while its clients still reach it. Made with `ip` (Debian's iproute2); needs the
/// rights to make network namespaces (root, or CAP_NET_ADMIN).
///
/// For example:
///
/// ```swift
/// let host = try await NetworkNamespace.make()
/// let cluster = try await PostgresCluster.start(tcpAddresses: [host.databaseSideAddress])
/// let node = try await ServerProcess(arguments: …, executable: …)   // host.command([...])
/// try await host.cutDatabaseLink()
/// ```
public final class NetworkNamespace: Sendable {
    public let name: String
    /// The namespace's address on the client link (where a server inside listens).
    public let address: String
    /// This side's address on the database link (where a database outside listens).
    public let databaseSideAddress: String
    private let clientLink: String
    private let databaseLink: String
    private let removed = Mutex(false)

    /// Makes the namespace and its links (a dozen `ip` commands, on a thread of their own).
    public static func make() async throws -> NetworkNamespace {
        try await onOwnThread { try NetworkNamespace() }
    }

    private init() throws {
        let tag = String(UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(6)).lowercased()
        name = "tandem-\(tag)"
        clientLink = "tc\(tag)"
        databaseLink = "td\(tag)"
        let a = Int.random(in: 100...199), b = Int.random(in: 0...126) * 2
        address = "10.\(a).\(b).2"
        databaseSideAddress = "10.\(a).\(b + 1).1"
        do {
            try Self.ip(["netns", "add", name])
        } catch {
            throw HarnessError(
                "cannot make a network namespace (ip netns add needs root or CAP_NET_ADMIN): \(error)")
        }
        do {
            try Self.ip(["netns", "exec", name, "ip", "link", "set", "lo", "up"])
            for (link, subnet) in [(clientLink, "10.\(a).\(b)"), (databaseLink, "10.\(a).\(b + 1)")] {
                try Self.ip(["link", "add", "\(link)h", "type", "veth", "peer", "name", "\(link)n"])
                try Self.ip(["link", "set", "\(link)n", "netns", name])
                try Self.ip(["addr", "add", "\(subnet).1/24", "dev", "\(link)h"])
                try Self.ip(["link", "set", "\(link)h", "up"])
                try Self.ip(["netns", "exec", name, "ip", "addr", "add", "\(subnet).2/24", "dev", "\(link)n"])
                try Self.ip(["netns", "exec", name, "ip", "link", "set", "\(link)n", "up"])
            }
        } catch {
            try? Self.ip(["netns", "del", name])
            throw error
        }
    }

    /// Removes the links and the namespace, on a thread of its own. Without it, `deinit` does
    /// (blocking whichever thread drops the last reference).
    public func remove() async {
        guard
            removed.withLock({ removed in
                defer { removed = true }; return !removed
            })
        else { return }
        let (clientLink, databaseLink, name) = (clientLink, databaseLink, name)
        _ = try? await onOwnThread { Self.tearDown(clientLink, databaseLink, name) }
    }

    deinit {
        if !removed.withLock({ $0 }) { Self.tearDown(clientLink, databaseLink, name) }
    }

    private static func tearDown(_ clientLink: String, _ databaseLink: String, _ name: String) {
        try? ip(["link", "del", "\(clientLink)h"])
        try? ip(["link", "del", "\(databaseLink)h"])
        try? ip(["netns", "del", name])
    }

    /// A command run inside the namespace: `ip netns exec NAME …`.
    public func command(_ arguments: [String]) -> (executable: URL, arguments: [String]) {
        (URL(fileURLWithPath: Self.ipPath), ["netns", "exec", name] + arguments)
    }

    /// Cuts the database link: packets are dropped, as in a network partition (no reset).
    public func cutDatabaseLink() async throws {
        let link = databaseLink
        try await onOwnThread { try Self.ip(["link", "set", "\(link)h", "down"]) }
    }

    public func healDatabaseLink() async throws {
        let link = databaseLink
        try await onOwnThread { try Self.ip(["link", "set", "\(link)h", "up"]) }
    }

    static let ipPath =
        ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].first {
            FileManager.default.isExecutableFile(atPath: $0)
        } ?? "/usr/sbin/ip"

    private static func ip(_ arguments: [String]) throws {
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: ipPath)
        process.arguments = arguments
        let errors = Pipe()
        process.standardError = errors
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        let text = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw HarnessError("ip \(arguments.joined(separator: " ")) failed: \(text)")
        }
    }
}
